"""NCCL for CUDA tensors: runs where a GPU is present, skips elsewhere."""

from __future__ import annotations

import pytest
import torch

from tests.spawn_util import run_ranks

pytestmark = pytest.mark.gpu


def _cuda_job() -> list[str]:
    import hora.native as hn

    hn.init()
    r, n = hn.rank(), hn.size()
    dev = torch.device("cuda", 0)
    fails = []
    v = hn.allreduce(torch.full((4,), float(r), device=dev), op=hn.Sum, name="cuda.ar")
    if v.device.type != "cuda" or v.cpu().tolist() != [float(sum(range(n)))] * 4:
        fails.append(f"allreduce {v}")
    hs = [hn.allreduce_async(torch.full((10,), float(r), device=dev), op=hn.Sum, name=f"cuda.f{i}") for i in range(5)]
    if any(h.synchronize().cpu().tolist() != [float(sum(range(n)))] * 10 for h in hs):
        fails.append("fused cuda")
    g = hn.allgather(torch.full((r + 1,), r, device=dev), name="cuda.ag")
    if g.cpu().tolist() != [k for k in range(n) for _ in range(k + 1)]:
        fails.append(f"allgather {g}")
    b = hn.broadcast(torch.full((2,), float(r), device=dev), root_rank=0, name="cuda.bc")
    if b.cpu().tolist() != [0.0, 0.0]:
        fails.append(f"broadcast {b}")
    hn.shutdown()
    return fails


@pytest.mark.timeout(120)
def test_cuda_tensors_go_through_nccl():
    from hora.native.backends.nccl import nccl_available

    if not nccl_available():
        pytest.skip("no CUDA device with NCCL here")
    if torch.cuda.device_count() < 2:  # NCCL refuses two ranks on one device (hora says so at pinning)
        pytest.skip(f"two ranks need a GPU each for NCCL; this host has {torch.cuda.device_count()}")
    outs = run_ranks(_cuda_job, 2, timeout=110, env={"NCCL_SOCKET_IFNAME": "lo"})
    assert outs == [[], []]


def test_nccl_requested_without_gpu_is_a_config_error(monkeypatch):
    from hora.errors import ConfigError
    from hora.native.backends.nccl import nccl_available

    if nccl_available():
        pytest.skip("a GPU is present")
    import hora.native as hn

    for k in ("HORA_RANK", "HORA_RENDEZVOUS_ADDR", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HORA_BACKEND", "nccl")
    with pytest.raises(ConfigError, match="NCCL"):
        hn.init()
    assert not hn.is_initialized()
