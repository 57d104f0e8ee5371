"""examples/torch_mnist_elastic.py (Horovod's elastic MNIST program, migrated by renaming, on
generated MNIST-shaped data) under elastic ``hora run``, with one rank killed in epoch 1."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from .helpers import HoraRun, discovery_script, no_processes_of, worker_pid

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_mnist_elastic.py"


@pytest.mark.timeout(600)
def test_elastic_mnist_example_survives_a_killed_rank(tmp_path):
    script, _ = discovery_script(tmp_path, "localhost:2\n127.0.0.1:1\n")
    run = HoraRun(["--min-np", "2", "--max-np", "3", "--host-discovery-script", str(script), sys.executable,
                   str(EXAMPLE), "--epochs", "3", "--num-samples", "3072"], tmp_path)
    try:
        run.wait_for(r"Train Epoch: 1 batch 10 size 3 ")
        os.kill(worker_pid(EXAMPLE, "127.0.0.1[0]"), signal.SIGKILL)
        code = run.finish(timeout=400)
    finally:
        run.kill()
    text = "\n".join(run.lines)
    assert code == 0, text[-4000:]
    assert re.search(r"worker 127\.0\.0\.1\[0\] \(rank 2 on 127\.0\.0\.1 failed with signal 9 \(SIGKILL\)\)", text)
    assert "reset: 2 ranks, lr 0.1" in text  # the reset callback rescaled the learning rate
    assert re.search(r"<stdout>:Train Epoch: 3 batch \d+ size 2 rank 0", text)
    accuracy = float(re.search(r"Test set: Average loss: [\d.]+, Accuracy: ([\d.]+)%", text).group(1))
    assert accuracy > 90.0, text[-3000:]
    no_processes_of(EXAMPLE)
