"""examples/torch_synthetic.py under the real launcher: `hora run -np 2 python ...`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_torch_synthetic_example_under_hora_run():
    # ranks forked from a warm server (hora run --warm) that has torch imported
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HORA_WARM_COMMANDS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "hora", "run", "-np", "2",
         sys.executable, str(ROOT / "examples" / "torch_synthetic.py"), "--epochs", "4"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=170,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    epochs = [line for line in proc.stdout.splitlines() if "loss" in line and "epoch" in line]
    assert len(epochs) == 4, out  # rank 0 only prints, once per epoch
    assert all(line.startswith("[0]") for line in epochs), out
    assert "weights identical on all 2 ranks" in proc.stdout, out
