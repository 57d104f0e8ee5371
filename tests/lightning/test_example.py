"""examples/lightning_synthetic.py under the real launcher: `hora run -np 2 python ...`."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = next((p for p in ("lightning", "pytorch_lightning") if importlib.util.find_spec(p) is not None), None)


@pytest.mark.timeout(240)
@pytest.mark.skipif(PACKAGE is None, reason="neither lightning nor pytorch_lightning is installed")
def test_lightning_example_under_hora_run(tmp_path):
    # ranks forked from a warm server (hora run --warm) that has torch imported
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HORA_WARM_COMMANDS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "hora", "run", "-np", "2", sys.executable, str(ROOT / "examples" / "lightning_synthetic.py"),
         "--epochs", "2", "--package", PACKAGE, "--ckpt-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=230,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    epochs = [line for line in proc.stdout.splitlines() if "epoch" in line and "loss" in line]
    assert len(epochs) == 4, out  # 2 epochs, then 2 more resumed; printed by rank 0 only
    assert all(line.startswith("[0]") for line in epochs), out
    assert "weights identical on all 2 ranks" in proc.stdout, out
    assert "resumed at epoch 3, 2 more epochs" in proc.stdout, out
    assert "last.ckpt" in os.listdir(tmp_path)
