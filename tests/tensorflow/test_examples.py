"""examples/tensorflow_digits.py, Horovod's classic TF2 program, under ``hora run -np 2``.

(examples/spark_keras_digits.py runs with the other Spark examples, in one process:
tests/estimators/test_column_type_examples.py::test_spark_keras_digits_example.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tf

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tensorflow_digits.py"


@pytest.mark.timeout(280)
def test_tensorflow_digits_example_under_hora_run(tmp_path):
    ckpt = tmp_path / "ckpt"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "hora", "run", "-np", "2", sys.executable, str(EXAMPLE), "--epochs", "3",
         "--checkpoint-dir", str(ckpt)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=250,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    losses = [float(m) for m in re.findall(r"epoch \d+/3: loss ([0-9.]+)", proc.stdout)]
    assert len(losses) == 3, proc.stdout  # printed by rank 0 only
    assert losses[-1] < 0.7 * losses[0], losses
    assert "weights equal on all 2 ranks: True" in proc.stdout
    assert any(p.name.startswith("ckpt-") for p in ckpt.iterdir())  # rank 0 checkpointed
