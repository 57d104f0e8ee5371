"""Functions run on every rank by tests/native/test_lifecycle.py: init/shutdown cycles,
op errors followed by good ops, ranks that shut down or stall while others work."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from typing import Any

import torch


def census() -> dict[str, Any]:
    """What a process holds that a leak would grow: open fds, threads, hora's /dev/shm files."""
    gc.collect()
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": sorted(t.name for t in threading.enumerate()),
        "shm": sorted(f for f in os.listdir("/dev/shm") if f.startswith("hora-")),
    }


def cycles(n: int) -> dict[str, Any]:
    """``n`` times: init, a few ops (a process set every 20th time), barrier, shutdown."""
    import hora.native as hn

    hn.init()
    rank, size = hn.rank(), hn.size()
    hn.allreduce(torch.ones(2), name="warm")
    hn.shutdown()
    before = census()
    wrong = []
    t0 = time.monotonic()
    for i in range(n):
        hn.init()
        got = hn.allreduce(torch.full((4,), float(rank + 1)), op=hn.Sum, name=f"cycle.{i}")
        if got.tolist() != [float(size * (size + 1) // 2)] * 4:
            wrong.append((i, got.tolist()))
        if i % 20 == 0:
            ps = hn.add_process_set(list(range(size)))
            gathered = hn.allgather(torch.tensor([rank]), process_set=ps)
            if gathered.tolist() != list(range(size)):
                wrong.append((i, gathered.tolist()))
            hn.remove_process_set(ps)
        hn.barrier()
        hn.shutdown()
    return {"before": before, "after": census(), "wrong": wrong, "seconds": time.monotonic() - t0,
            "initialized": hn.is_initialized()}


def errors_then_good_ops() -> dict[str, Any]:
    """Every kind of op error, each followed by ops that must work on the same engine."""
    import hora.native as hn
    from hora.errors import CollectiveError, ConfigError, DataError

    hn.init()
    r, n = hn.rank(), hn.size()
    seen: dict[str, str] = {}

    def expect(what: str, errors: tuple, fn: Any) -> None:
        try:
            fn()
            seen[what] = "NO ERROR"
        except errors as exc:
            seen[what] = type(exc).__name__
        # the engine is still usable: a good op of each kind right after
        s = hn.allreduce(torch.ones(3), op=hn.Sum, name=f"after.{what}")
        g = hn.allgather(torch.full((1, 2), r, dtype=torch.int16), name=f"after.ag.{what}")
        if s.tolist() != [float(n)] * 3 or g[:, 0].tolist() != list(range(n)):
            seen[what] += " then WRONG"

    expect("shape", (CollectiveError,), lambda: hn.allreduce(torch.ones(2 + r), name="e.shape"))
    expect("dtype", (CollectiveError,),
           lambda: hn.allgather(torch.ones(2, dtype=torch.float32 if r else torch.int32), name="e.dtype"))
    expect("root", (CollectiveError,), lambda: hn.broadcast(torch.ones(2), root_rank=r, name="e.root"))
    expect("bad_root_arg", (ConfigError,), lambda: hn.broadcast(torch.ones(2), root_rank=n + 5, name="e.badroot"))
    expect("bad_splits", (ConfigError,), lambda: hn.alltoall(torch.ones(n), splits=[1.5] * n, name="e.splits"))
    expect("float_splits", (ConfigError,),
           lambda: hn.alltoall(torch.ones(n), splits=torch.ones(n), name="e.fsplits"))
    expect("scalar_reducescatter", (DataError,), lambda: hn.reducescatter(torch.tensor(1.0), name="e.rs"))
    expect("adasum_reducescatter", (NotImplementedError,),
           lambda: hn.reducescatter(torch.ones(n), op=hn.Adasum, name="e.rsada"))
    expect("adasum_int", (DataError,), lambda: hn.allreduce(torch.ones(2, dtype=torch.int32), op=hn.Adasum))

    def duplicate() -> None:
        h = hn.allreduce_async(torch.ones(1), name="e.dup")
        try:
            hn.allreduce_async(torch.ones(1), name="e.dup")
        finally:
            h.synchronize()

    expect("duplicate", (ConfigError,), duplicate)
    # dtypes Gloo cannot carry as they are travel as bytes; reductions upcast
    moved = {}
    for dt in (torch.int16, torch.uint16, torch.uint32, torch.bool, torch.complex64, torch.bfloat16):
        t = (torch.arange(3) + r).to(dt) if dt != torch.bool else torch.tensor([r % 2 == 0] * 3)
        try:
            ag = hn.allgather(t.reshape(1, 3), name=f"m.ag.{dt}")
            bc = hn.broadcast(t.clone(), root_rank=n - 1, name=f"m.bc.{dt}")
            a2a, _ = hn.alltoall(t[:1].repeat(n), name=f"m.a2a.{dt}")
            def same(a: torch.Tensor, b: torch.Tensor) -> bool:  # bitwise (not every dtype has ==)
                return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))

            def of(k: int) -> torch.Tensor:
                return (torch.arange(3) + k).to(dt) if dt != torch.bool else torch.tensor([k % 2 == 0] * 3)

            ok = (ag.dtype == dt and ag.shape == (n, 3) and bc.dtype == dt and a2a.shape == (n,)
                  and all(same(ag[k], of(k)) for k in range(n)) and same(bc, of(n - 1))
                  and all(same(a2a[k : k + 1], of(k)[:1]) for k in range(n)))
            moved[str(dt)] = "ok" if ok else f"WRONG {ag} {bc} {a2a}"
        except Exception as exc:  # noqa: BLE001 - reported
            moved[str(dt)] = f"FAILED {exc!r}"
    s16 = hn.allreduce(torch.full((2,), 300 + r, dtype=torch.int16), op=hn.Sum, name="m.ar16")
    moved["int16 allreduce"] = "ok" if s16.tolist() == [300 * n + n * (n - 1) // 2] * 2 else f"WRONG {s16}"
    # integer average and scaling round toward zero, as Horovod
    avg = hn.allreduce(torch.tensor([-3 if r == 0 else 0], dtype=torch.int32), op=hn.Average, name="m.trunc")
    pre = hn.allreduce(torch.tensor([-7], dtype=torch.int64), op=hn.Sum, prescale_factor=0.5, name="m.pre")
    moved["trunc"] = [int(avg.item()), int(pre.item())]
    hn.shutdown()
    return {"errors": seen, "moved": moved}


def join_then_other_ops() -> dict[str, Any]:
    """While a rank has joined, allreduces get its zeros and any other op fails at once."""
    import hora.native as hn
    from hora.errors import CollectiveError

    hn.init()
    r, n = hn.rank(), hn.size()
    out: dict[str, Any] = {}
    if r == 0:
        out["last"] = hn.join()
    else:
        out["avg"] = hn.allreduce(torch.full((2,), float(n)), op=hn.Average, name="j.ar").tolist()
        for what, fn in (("allgather", lambda: hn.allgather(torch.ones(1), name="j.ag")),
                         ("broadcast", lambda: hn.broadcast(torch.ones(1), root_rank=1, name="j.bc"))):
            t0 = time.monotonic()
            try:
                fn()
                out[what] = "NO ERROR"
            except CollectiveError as exc:
                out[what] = ("joined" in str(exc), round(time.monotonic() - t0, 1))
        out["last"] = hn.join(-1)
    out["after"] = hn.allreduce(torch.ones(1), op=hn.Sum, name="j.after").tolist()
    hn.shutdown()
    return out


def one_rank_shuts_down_early() -> dict[str, Any]:
    """Rank 0 shuts down while rank 1 still waits in a barrier rank 0 never joins: rank 1's
    barrier fails at once (not after HORA_SHUTDOWN_TIMEOUT), and rank 1's next init starts
    a fresh engine that meets rank 0's next init."""
    import hora.native as hn
    from hora.errors import CollectiveError

    hn.init()
    r = hn.rank()
    out: dict[str, Any] = {}
    hn.allreduce(torch.ones(1), name="s.first")
    if r == 0:
        t0 = time.monotonic()
        hn.shutdown()
        out["shutdown_s"] = round(time.monotonic() - t0, 1)
    else:
        time.sleep(0.5)
        t0 = time.monotonic()
        try:
            hn.barrier()
            out["barrier"] = "NO ERROR"
        except CollectiveError as exc:
            out["barrier"] = ("shut down" in str(exc), round(time.monotonic() - t0, 1))
        out["still_initialized"] = hn.is_initialized()
    hn.init()  # rank 1: its engine has lost rank 0, so this resets it
    out["again"] = hn.allreduce(torch.full((1,), float(r)), op=hn.Sum, name="s.again").tolist()
    hn.shutdown()
    return out


def shutdown_while_peer_is_stopped(shm_timeout: float) -> dict[str, Any]:
    """Rank 1 stops its whole process (SIGSTOP) while rank 0's engine thread waits inside a
    shared-memory allreduce for it; rank 0's shutdown gives up, interrupts that wait and
    releases the segments only once its thread is out (before: SIGSEGV), resumes rank 1,
    and both meet again in the job's next generation."""
    import hora.native as hn
    from hora.errors import CollectiveError
    from hora.native.ops import allgather_object

    hn.init()
    r = hn.rank()
    pids = allgather_object(os.getpid(), name="pids")
    out: dict[str, Any] = {}
    if r == 1:
        hn.barrier()
        os.kill(os.getpid(), signal.SIGSTOP)  # rank 0 resumes us
        try:
            hn.allreduce(torch.ones(2), name="x.stuck")
            out["stuck"] = "NO ERROR"
        except CollectiveError as exc:
            out["stuck"] = type(exc).__name__
    else:
        hn.barrier()
        time.sleep(0.5)  # rank 1 is stopped now
        h = hn.allreduce_async(torch.ones(2), name="x.stuck")
        time.sleep(1.0)  # our engine thread is inside the round, waiting for rank 1
        t0 = time.monotonic()
        hn.shutdown()  # HORA_SHUTDOWN_TIMEOUT is short in this test
        out["shutdown_s"] = round(time.monotonic() - t0, 1)
        out["handle_failed"] = h.poll() and isinstance(h._error, CollectiveError)
        os.kill(pids[1], signal.SIGCONT)
    hn.init()
    out["again"] = hn.allreduce(torch.full((3,), float(r + 1)), op=hn.Sum, name="x.again").tolist()
    hn.shutdown()
    out["census"] = census()
    return out
