"""benchmarks/gpu_check.py: on CPU it runs end to end and passes; on a GPU (marked gpu) its CUDA checks pass."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def _run(device: str, out: Path, timeout: int, *extra: str) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", device, "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.timeout(480)
def test_gpu_check_runs_on_cpu(tmp_path):
    # five small estimator fits among the checks; the throughput rows on 512 rows: every figure, fewer steps
    report = _run("cpu", tmp_path / "gc.json", 450, "--rows", "512")
    status = {r["name"].split(" ")[0]: r["status"] for r in report["rows"]}
    assert status["collectives"] == "pass" and status["DistributedOptimizer"] == "pass"
    assert status["pinning:"] == "pass" and status["transform"] == "pass"
    by_name = {r["name"].split(" ")[0]: r for r in report["rows"]}
    mixed = by_name["TorchEstimator"]  # precision 16-mixed / bf16-mixed against 32: runs on the CPU too
    assert mixed["status"] == "pass" and mixed["numbers"]["scale"] > 0, mixed
    fsdp = by_name["LightningEstimator"]  # Lightning's FSDPStrategy needs a GPU: reported, not faked
    assert fsdp["status"] == "skip" and "GPU" in fsdp["result"], fsdp
    assert report["env"]["device"] == "cpu"
    throughput = [r for r in report["rows"] if r["name"].startswith("estimator throughput")]
    assert len(throughput) == 2 and all(r["status"] == "pass" for r in throughput), throughput
    for r in throughput:  # every figure a GPU run reports, at CPU sizes
        nums = r["numbers"]
        assert 0.0 <= nums["data_wait"] <= 1.0 and nums["hora_rows_s"] > 0 and nums["ceiling_rows_s"] > 0, nums
        assert nums["dataloader_rows_s"] > 0 and nums["x_ceiling"] > 0 and nums["x_dataloader"] > 0, nums
    sharded = by_name["sharded"]
    assert sharded["status"] == "pass" and 0 < sharded["numbers"]["zero2_x_hora"] < 1.0, sharded


@pytest.mark.gpu
@pytest.mark.timeout(400)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_check_on_cuda(tmp_path):
    report = _run("cuda", tmp_path / "gc.json", 380)
    failed = [r for r in report["rows"] if r["status"] == "fail"]
    assert not failed, failed


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_allreduce_waits_for_producer_stream():
    import hora.torch as hvd

    hvd.init()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.empty(1 << 20, dtype=dtype, device="cuda")
        torch.cuda._sleep(1_000_000)
        x.fill_(3.0)
        y = hvd.allreduce(x, op=hvd.Sum)
        assert y.is_cuda and y.dtype == dtype
        assert torch.all(y.float() == 3.0 * hvd.size()).item()
