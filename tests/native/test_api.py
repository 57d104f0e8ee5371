"""hora.native in one process: errors before init, bad input, single-rank jobs, units."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import hora.native as hn
from hora.errors import CollectiveError, ConfigError, DataError, NotInitializedError
from hora.native.engine import ALLREDUCE, EngineConfig, Request, ResponseCache
from hora.native.timeline import summarize


@pytest.fixture
def no_launcher_env(monkeypatch):
    """A process started without any launcher (no HORA_*, no MPI variables)."""
    for k in list(os.environ):
        if k.startswith("HORA_") or k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
            monkeypatch.delenv(k, raising=False)
    yield
    hn.shutdown()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "call",
    [
        lambda: hn.rank(),
        lambda: hn.size(),
        lambda: hn.local_rank(),
        lambda: hn.allreduce(torch.ones(1)),
        lambda: hn.allreduce_async_(np.ones(1)),
        lambda: hn.allgather(torch.ones(1)),
        lambda: hn.broadcast(torch.ones(1), 0),
        lambda: hn.alltoall(torch.ones(1)),
        lambda: hn.reducescatter(torch.ones(1)),
        lambda: hn.barrier(),
        lambda: hn.join(),
        lambda: hn.broadcast_object(1),
        lambda: hn.add_process_set([0]),
    ],
)
def test_ops_before_init_raise_not_initialized(call):
    assert not hn.is_initialized()
    with pytest.raises(NotInitializedError, match=r"call hora.init\(\)"):
        call()


@pytest.mark.timeout(30)
def test_unknown_backend_is_a_config_error(no_launcher_env, monkeypatch):
    monkeypatch.setenv("HORA_BACKEND", "carrier-pigeon")
    with pytest.raises(ConfigError, match="carrier-pigeon"):
        hn.init()
    assert not hn.is_initialized()


@pytest.mark.timeout(30)
def test_malformed_engine_settings_are_config_errors(monkeypatch):
    monkeypatch.setenv("HORA_CYCLE_TIME", "fast")
    with pytest.raises(ConfigError, match="HORA_CYCLE_TIME"):
        EngineConfig()
    monkeypatch.setenv("HORA_CYCLE_TIME", "1")
    monkeypatch.setenv("HORA_OP_TIMEOUT", "0")
    with pytest.raises(ConfigError, match="HORA_OP_TIMEOUT"):
        EngineConfig()


@pytest.mark.timeout(60)
def test_single_process_job_without_launcher(no_launcher_env):
    hn.init()
    hn.init()  # idempotent
    assert hn.is_initialized() and (hn.rank(), hn.size(), hn.local_rank(), hn.local_size()) == (0, 1, 0, 1)
    assert hn.allreduce(torch.tensor([2.0, 4.0])).tolist() == [2.0, 4.0]
    a = np.arange(4, dtype=np.int64)
    assert hn.allreduce_(a, op=hn.Sum) is a and a.tolist() == [0, 1, 2, 3]
    res = hn.allreduce(np.ones(3, dtype=np.float32), op=hn.Sum, postscale_factor=3.0)
    assert isinstance(res, np.ndarray) and res.tolist() == [3.0] * 3
    assert hn.allgather(torch.ones(2, 2)).shape == (2, 2)
    assert hn.broadcast(torch.ones(2), root_rank=0).tolist() == [1.0, 1.0]
    out, splits = hn.alltoall(np.arange(3))
    assert out.tolist() == [0, 1, 2] and splits.tolist() == [3]
    assert hn.reducescatter(torch.ones(3), op=hn.Sum).tolist() == [1.0] * 3
    assert hn.broadcast_object({"x": 1}) == {"x": 1} and hn.allgather_object("a") == ["a"]
    assert hn.join() == 0
    hn.barrier()
    nc = torch.arange(12.0).reshape(3, 4).t()  # non-contiguous, in place
    assert hn.allreduce_(nc, op=hn.Sum) is nc and torch.equal(nc, torch.arange(12.0).reshape(3, 4).t())
    hn.shutdown()
    assert not hn.is_initialized()
    hn.shutdown()  # idempotent


@pytest.mark.timeout(40)
def test_init_names_a_rank_that_never_arrives_after_the_start_timeout(no_launcher_env, monkeypatch):
    # rank 1 of 2 never starts: init must give up after HORA_START_TIMEOUT (1 s) naming it,
    # not after the Gloo connect timeout (HORA_COLLECTIVE_TIMEOUT, set far beyond the test's)
    from hora.errors import RendezvousError
    from hora.native.rendezvous import RendezvousServer, make_secret

    secret = make_secret()
    server = RendezvousServer(secret, "127.0.0.1")
    server.start()
    try:
        for k, v in {"HORA_RANK": "0", "HORA_SIZE": "2", "HORA_RENDEZVOUS_ADDR": server.addr,
                     "HORA_SECRET": secret.hex(), "HORA_JOB_ID": "late", "HORA_HOSTNAME": "127.0.0.1",
                     "HORA_START_TIMEOUT": "1", "HORA_COLLECTIVE_TIMEOUT": "600"}.items():
            monkeypatch.setenv(k, v)
        with pytest.raises(RendezvousError, match=r"rank\(s\) \[1\] never arrived at rendezvous '[^']*/init'"):
            hn.init()
        assert not hn.is_initialized()
    finally:
        server.stop()


@pytest.mark.timeout(60)
def test_bad_input_gets_clear_errors(no_launcher_env):
    hn.init()
    with pytest.raises(DataError, match="torch.Tensor or a numpy.ndarray"):
        hn.allreduce([1, 2, 3])
    with pytest.raises(DataError, match="object"):
        hn.allgather(np.array([object()]))
    with pytest.raises(DataError, match="bool"):
        hn.allreduce(torch.ones(2, dtype=torch.bool))
    with pytest.raises(ConfigError, match="op="):
        hn.allreduce(torch.ones(1), op="median")
    with pytest.raises(ConfigError, match="compression"):
        hn.allreduce(torch.ones(1), compression="zip")
    with pytest.raises(ConfigError, match="root_rank=3"):
        hn.broadcast(torch.ones(1), root_rank=3)
    with pytest.raises(ConfigError, match="splits"):
        hn.alltoall(torch.ones(4), splits=[1, 2])
    with pytest.raises(ConfigError, match="splits"):
        hn.alltoall(torch.ones(4), splits=[3])
    with pytest.raises(ConfigError, match="not registered"):
        hn.allreduce(torch.ones(1), process_set=hn.ProcessSet([0]))
    with pytest.raises(ConfigError, match="outside"):
        hn.add_process_set([0, 1])
    with pytest.raises(ConfigError, match="duplicates"):
        hn.ProcessSet([0, 0])
    with pytest.raises(ConfigError, match="name"):
        hn.allreduce(torch.ones(1), name="")
    with pytest.raises(ConfigError, match="Handle"):
        hn.synchronize("not a handle")


@pytest.mark.timeout(60)
def test_engine_stats_count_work(no_launcher_env):
    hn.init()
    hs = [hn.allreduce_async(torch.ones(8), name=f"s.{i}") for i in range(10)]
    [h.synchronize() for h in hs]
    s = hn.engine_stats()
    assert s["allreduce_tensors"] == 10 and s["rounds"] >= 1 and s["cache_misses"] == 10


def _req(name: str, n: int = 4) -> Request:
    return Request(ALLREDUCE, name, 0, tensor=torch.ones(n), output=torch.ones(n))


def test_response_cache_lru_and_invalidation():
    c = ResponseCache(2)
    a, b, d = _req("a"), _req("b"), _req("d")
    c.put("a", a.key, {0: None})
    c.put("b", b.key, {0: None})
    ea = c.lookup(a, 0)
    assert ea is not None and c.lookup(_req("a", 5), 0) is None  # other shape: miss
    c.touch(ea)  # b is now least recently used
    c.put("d", d.key, {0: None})
    assert c.lookup(b, 0) is None and c.lookup(a, 0) is ea and c.lookup(d, 0) is not None
    c.erase("a")
    assert not c.valid(ea) and len(c.by_name) == 1


def test_timeline_summarize_table_and_errors(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": [
        {"name": "NEGOTIATE", "ph": "X", "ts": 0, "dur": 100, "pid": 0, "tid": 1},
        {"name": "COLLECTIVE", "ph": "X", "ts": 100, "dur": 300, "pid": 0, "tid": 1},
        {"name": "COLLECTIVE", "ph": "X", "ts": 400, "dur": 100, "pid": 0, "tid": 2},
    ]}))
    text = summarize(str(p))
    line = next(x for x in text.splitlines() if x.startswith("COLLECTIVE"))
    assert line.split() == ["COLLECTIVE", "2", "0.400", "200.0", "300.0"]
    with pytest.raises(ConfigError, match="does not exist"):
        summarize(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        summarize(str(tmp_path / "bad.json"))


def test_compression_roundtrip():
    t = torch.randn(10, dtype=torch.float32)
    for comp, wire in ((hn.Compression.fp16, torch.float16), (hn.Compression.bf16, torch.bfloat16)):
        c, ctx = comp.compress(t)
        assert c.dtype == wire
        back = comp.decompress(c, ctx)
        assert back.dtype == torch.float32 and torch.allclose(back, t, rtol=1e-2, atol=1e-2)
    i = torch.arange(3)
    c, ctx = hn.Compression.fp16.compress(i)
    assert c is i and hn.Compression.fp16.decompress(c, ctx) is i


def test_collective_error_is_a_runtime_error():
    assert issubclass(CollectiveError, RuntimeError)


@pytest.mark.timeout(120)
def test_rendezvous_import_does_not_import_torch():
    # launchers, Spark/Dask task supervisors and drivers import the rendezvous module only:
    # they must not pay for importing torch
    import subprocess
    import sys

    code = ("import hora.native.rendezvous, hora.native, sys; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert res.returncode == 0, res.stderr
    # the lazy package still offers the whole API, by attribute, from-import, star-import and dir()
    code = ("import hora.native as hn; from hora.native import allreduce, Sum; from hora.native import *; "
            "import hora.native.ops as ops; "
            "assert allreduce is ops.allreduce is hn.allreduce and Sum is hn.ReduceOp.Sum; "
            "assert grouped_allreduce_async is ops.grouped_allreduce_async; "
            "assert set(hn.__all__) <= set(dir(hn)) and 'rendezvous' in dir(hn); "
            "assert hn.engine.Handle is hn.Handle; "
            "print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
    with pytest.raises(AttributeError, match="no_such_op"):
        hn.no_such_op  # noqa: B018
