"""examples/tensorflow_digits.py, Horovod's classic TF2 program, on 2 real processes."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.spawn_util import run_ranks

pytestmark = pytest.mark.tf

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tensorflow_digits.py"


def _run_example(path: str, argv: list[str]) -> dict:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    spec = importlib.util.spec_from_file_location("tensorflow_digits", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    return module.main(argv)


@pytest.mark.timeout(280)
def test_tensorflow_digits_example_on_two_ranks(tmp_path):
    ckpt = tmp_path / "ckpt"
    res = run_ranks(_run_example, 2, args=(str(EXAMPLE), ["--epochs", "3", "--checkpoint-dir", str(ckpt)]),
                    timeout=250)
    assert [r["rank"] for r in res] == [0, 1] and all(r["size"] == 2 for r in res)
    for r in res:
        assert r["weights_equal"]
        assert r["epoch_losses"][-1] < 0.7 * r["epoch_losses"][0], r["epoch_losses"]
    assert res[0]["epoch_losses"] == res[1]["epoch_losses"]  # averaged across ranks
    assert any(p.name.startswith("ckpt-") for p in ckpt.iterdir())  # rank 0 checkpointed
