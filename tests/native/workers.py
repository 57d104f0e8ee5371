"""Module-level functions run on every rank by the tests in this package.

Each returns plain data (lists of failures, values, counters) so the test process can
assert on all ranks at once. They batch many checks per spawned job because process
start-up dominates on a small machine.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

DTYPES = ["float16", "bfloat16", "float32", "float64", "int16", "int32", "int64"]


def _tol(dtype: torch.dtype) -> dict[str, float]:
    if dtype in (torch.float16, torch.bfloat16):
        return {"rtol": 2e-2, "atol": 1e-2}
    return {"rtol": 1e-6, "atol": 1e-6}


def _close(a: Any, b: torch.Tensor, dtype: torch.dtype) -> bool:
    a = torch.as_tensor(a)
    if a.dtype != b.dtype and not (a.dtype == torch.float64 and b.dtype == torch.float64):
        pass
    return torch.allclose(a.double(), b.double(), **_tol(dtype))


def all_ops_all_dtypes(use_numpy: bool = False) -> list[str]:
    """Every op x every dtype x every reduce op; returns the failures seen on this rank."""
    import hora.native as hn

    hn.init()
    r, n = hn.rank(), hn.size()
    fails: list[str] = []

    def conv(t: torch.Tensor) -> Any:
        return t.numpy() if use_numpy else t

    def back(x: Any) -> torch.Tensor:
        if use_numpy:
            assert isinstance(x, np.ndarray), f"expected numpy back, got {type(x)}"
            return torch.from_numpy(x)
        assert isinstance(x, torch.Tensor), f"expected torch back, got {type(x)}"
        return x

    for dname in DTYPES:
        dtype = getattr(torch, dname)
        if use_numpy and dtype == torch.bfloat16:
            continue  # numpy has no bfloat16
        base = torch.arange(1, 7, dtype=torch.float64).reshape(2, 3)
        mine = (base + r).to(dtype)
        allv = torch.stack([(base + k) for k in range(n)])
        expect = {
            hn.Sum: allv.sum(0),
            hn.Min: allv.min(0).values,
            hn.Max: allv.max(0).values,
            hn.Product: allv.prod(0),
            hn.Average: (allv.sum(0) // n) if not dtype.is_floating_point else allv.sum(0) / n,
        }
        for op, exp in expect.items():
            try:
                got = back(hn.allreduce(conv(mine.clone()), op=op, name=f"ar.{dname}.{op.name}"))
                if got.dtype != dtype or tuple(got.shape) != (2, 3) or not _close(got, exp.to(dtype), dtype):
                    fails.append(f"allreduce {dname} {op.name}: got {got.tolist()} expected {exp.tolist()}")
                t = mine.clone()
                arr = conv(t)
                res = hn.allreduce_(arr, op=op, name=f"ar_.{dname}.{op.name}")
                if res is not arr or not _close(back(arr), exp.to(dtype), dtype):
                    fails.append(f"allreduce_ {dname} {op.name}: not in place or wrong: {back(arr).tolist()}")
            except Exception as exc:  # report, keep checking the rest
                fails.append(f"allreduce {dname} {op.name}: {exc!r}")
        # prescale / postscale
        try:
            got = back(hn.allreduce(conv(mine.clone()), op=hn.Sum, prescale_factor=2.0, postscale_factor=0.5,
                                    name=f"scale.{dname}"))
            if not _close(got, allv.sum(0).to(dtype), dtype):
                fails.append(f"pre/postscale {dname}: {got.tolist()}")
        except Exception as exc:
            fails.append(f"pre/postscale {dname}: {exc!r}")
        # allgather with dim 0 varying by rank
        try:
            piece = torch.full((r + 1, 3), r, dtype=dtype)
            got = back(hn.allgather(conv(piece), name=f"ag.{dname}"))
            exp = torch.cat([torch.full((k + 1, 3), k, dtype=dtype) for k in range(n)])
            if got.dtype != dtype or not torch.equal(got, exp):
                fails.append(f"allgather {dname}: {got.tolist()}")
        except Exception as exc:
            fails.append(f"allgather {dname}: {exc!r}")
        # broadcast from every root, in place and not
        for root in range(n):
            try:
                got = back(hn.broadcast(conv(mine.clone()), root_rank=root, name=f"bc.{dname}.{root}"))
                if not torch.equal(got, (base + root).to(dtype)):
                    fails.append(f"broadcast {dname} root {root}: {got.tolist()}")
                t = mine.clone()
                arr = conv(t)
                hn.broadcast_(arr, root_rank=root, name=f"bc_.{dname}.{root}")
                if not torch.equal(back(arr), (base + root).to(dtype)):
                    fails.append(f"broadcast_ {dname} root {root}: {back(arr).tolist()}")
            except Exception as exc:
                fails.append(f"broadcast {dname} root {root}: {exc!r}")
        # alltoall with uneven splits: rank r sends (j + 1) rows to rank j, each row = 10*r + j
        try:
            splits = [j + 1 for j in range(n)]
            rows = torch.cat([torch.full((j + 1, 2), 10 * r + j, dtype=dtype) for j in range(n)])
            out, rsplits = hn.alltoall(conv(rows), splits=splits, name=f"a2a.{dname}")
            out = back(out)
            exp = torch.cat([torch.full((r + 1, 2), 10 * k + r, dtype=dtype) for k in range(n)])
            if not torch.equal(out, exp) or list(back(rsplits).tolist()) != [r + 1] * n:
                fails.append(f"alltoall {dname}: {out.tolist()} splits {back(rsplits).tolist()}")
            out2, _ = hn.alltoall(conv(torch.arange(2 * n).to(dtype)), name=f"a2a_even.{dname}")
            exp2 = torch.tensor([2 * r + 0, 2 * r + 1] * 1, dtype=dtype)
            if not torch.equal(back(out2), exp2.repeat(n)):
                fails.append(f"alltoall even {dname}: {back(out2).tolist()}")
        except Exception as exc:
            fails.append(f"alltoall {dname}: {exc!r}")
        # reducescatter: even and uneven dim 0
        for rows_n in (2 * n, 2 * n + 1):
            for op in (hn.Sum, hn.Average, hn.Max):
                try:
                    t = (torch.arange(rows_n * 2, dtype=torch.float64).reshape(rows_n, 2) + r)
                    got = back(hn.reducescatter(conv(t.to(dtype)), op=op, name=f"rs.{dname}.{rows_n}.{op.name}"))
                    full = torch.stack([torch.arange(rows_n * 2, dtype=torch.float64).reshape(rows_n, 2) + k
                                        for k in range(n)])
                    red = {hn.Sum: full.sum(0), hn.Max: full.max(0).values,
                           hn.Average: (full.sum(0) / n) if dtype.is_floating_point else full.sum(0) // n}[op]
                    counts = [rows_n // n + (1 if i < rows_n % n else 0) for i in range(n)]
                    start = sum(counts[:r])
                    exp = red[start : start + counts[r]]
                    if tuple(got.shape) != tuple(exp.shape) or not _close(got, exp.to(dtype), dtype):
                        fails.append(f"reducescatter {dname} rows={rows_n} {op.name}: {got.tolist()} vs {exp.tolist()}")
                except Exception as exc:
                    fails.append(f"reducescatter {dname} rows={rows_n} {op.name}: {exc!r}")
    # grouped
    try:
        ts = [torch.full((k + 1,), float(r + k)) for k in range(5)]
        got = hn.grouped_allreduce([conv(t) for t in ts], op=hn.Sum, name="grouped")
        for k, g in enumerate(got):
            if not torch.allclose(back(g), torch.full((k + 1,), float(sum(q + k for q in range(n))))):
                fails.append(f"grouped_allreduce {k}: {back(g).tolist()}")
        ts2 = [conv(t.clone()) for t in ts]
        res = hn.grouped_allreduce_(ts2, op=hn.Average, name="grouped_")
        if any(a is not b for a, b in zip(res, ts2)):
            fails.append("grouped_allreduce_ did not return the inputs")
    except Exception as exc:
        fails.append(f"grouped: {exc!r}")
    hn.barrier()
    hn.shutdown()
    return fails


def async_objects_compression() -> dict[str, Any]:
    """Async handles, poll, objects, compression, join, barrier."""
    import hora.native as hn

    hn.init()
    r, n = hn.rank(), hn.size()
    out: dict[str, Any] = {"fails": []}
    fails = out["fails"]
    hs = [hn.allreduce_async(torch.full((4,), float(r)), op=hn.Sum, name=f"async.{i}") for i in range(10)]
    h_inplace = hn.allreduce_async_(torch.ones(3), name="async.inplace")
    gh = hn.grouped_allreduce_async([torch.ones(2), torch.ones(3)], op=hn.Sum, name="async.grouped")
    hb = hn.broadcast_async(torch.full((2,), float(r)), root_rank=0, name="async.bc")
    hb_ = hn.broadcast_async_(torch.full((2,), float(r)), root_rank=n - 1, name="async.bc_")
    hg = hn.allgather_async(torch.tensor([r]), name="async.ag")
    ha = hn.alltoall_async(torch.arange(n), name="async.a2a")
    hr = hn.reducescatter_async(torch.ones(n, 2), op=hn.Sum, name="async.rs")
    for i, h in enumerate(hs):
        v = hn.synchronize(h)
        if v.tolist() != [float(sum(range(n)))] * 4:
            fails.append(f"async {i}: {v.tolist()}")
        if not hn.poll(h):
            fails.append("poll is False after synchronize")
        if h.synchronize() is not v:  # a second synchronize returns the same result
            fails.append("second synchronize differs")
    if h_inplace.synchronize().tolist() != [1.0] * 3:
        fails.append("async inplace")
    if [t.tolist() for t in gh.synchronize()] != [[float(n)] * 2, [float(n)] * 3]:
        fails.append("grouped async")
    if hb.synchronize().tolist() != [0.0, 0.0] or hb_.synchronize().tolist() != [float(n - 1)] * 2:
        fails.append("broadcast async")
    if hg.synchronize().tolist() != list(range(n)):
        fails.append("allgather async")
    o, s = ha.synchronize()
    if o.tolist() != [r] * n or s.tolist() != [1] * n:
        fails.append(f"alltoall async {o.tolist()} {s.tolist()}")
    if hr.synchronize().tolist() != [[float(n)] * 2]:
        fails.append("reducescatter async")
    # objects
    obj = hn.broadcast_object({"rank": r, "f": (lambda x: x + 1) if r == 0 else None}, root_rank=0)
    if obj["rank"] != 0 or obj["f"](1) != 2:
        fails.append(f"broadcast_object {obj}")
    objs = hn.allgather_object([r] * (r + 1))
    if objs != [[k] * (k + 1) for k in range(n)]:
        fails.append(f"allgather_object {objs}")
    # compression on a fused group
    for comp in (hn.Compression.none, hn.Compression.fp16, hn.Compression.bf16):
        vals = hn.grouped_allreduce([torch.full((100,), 0.5 + r), torch.full((7,), 1.0)], op=hn.Average,
                                    compression=comp, name=f"comp.{comp.name}")
        exp = sum(0.5 + k for k in range(n)) / n
        if not torch.allclose(vals[0], torch.full((100,), exp), rtol=1e-2) or vals[0].dtype != torch.float32:
            fails.append(f"compression {comp.name}: {vals[0][:3].tolist()}")
        ints = hn.allreduce(torch.tensor([3, 5], dtype=torch.int64), op=hn.Sum, compression=comp,
                            name=f"comp.int.{comp.name}")
        if ints.tolist() != [3 * n, 5 * n]:
            fails.append(f"compression leaves ints alone {comp.name}: {ints.tolist()}")
    # join: rank 0 joins at once, the others reduce one more tensor (rank 0 contributes zeros)
    if r == 0:
        last = hn.join()
    else:
        v = hn.allreduce(torch.full((3,), float(r)), op=hn.Sum, name="after.join")
        if v.tolist() != [float(sum(range(1, n)))] * 3:
            fails.append(f"allreduce with a joined rank: {v.tolist()}")
        time.sleep(0.3)
        last = hn.join()
    out["last_joined"] = last
    hn.barrier()
    out["stats"] = hn.engine_stats()
    hn.shutdown()
    return out


def process_sets() -> list[str]:
    """Process sets on 3 ranks: [0, 2] and [1]; ops inside; bad uses; removal."""
    import hora.native as hn
    from hora.errors import ConfigError

    even = hn.ProcessSet([0, 2])
    hn.init(process_sets=[even])
    r = hn.rank()
    fails: list[str] = []
    solo = hn.add_process_set([1])
    if even.process_set_id is None or solo.process_set_id is None:
        fails.append("process sets not registered")
    if r in (0, 2):
        v = hn.allreduce(torch.tensor([float(r)]), op=hn.Sum, process_set=even, name="ps.ar")
        if v.tolist() != [2.0]:
            fails.append(f"ps allreduce {v.tolist()}")
        g = hn.allgather(torch.tensor([r]), process_set=even, name="ps.ag")
        if g.tolist() != [0, 2]:
            fails.append(f"ps allgather {g.tolist()}")
        b = hn.broadcast(torch.tensor([float(r)]), root_rank=2, process_set=even, name="ps.bc")
        if b.tolist() != [2.0]:
            fails.append(f"ps broadcast {b.tolist()}")
        o, s = hn.alltoall(torch.tensor([r, r]), process_set=even, name="ps.a2a")
        if o.tolist() != [0, 2]:
            fails.append(f"ps alltoall {o.tolist()}")
        rs = hn.reducescatter(torch.ones(2, 1), op=hn.Sum, process_set=even, name="ps.rs")
        if rs.tolist() != [[2.0]]:
            fails.append(f"ps reducescatter {rs.tolist()}")
        if even.rank() != [0, 2].index(r) or even.size() != 2 or not even.included():
            fails.append("ps rank/size")
        # unnamed ops over a subset are counted per set: rank 1's next unnamed global op
        # (below) still matches theirs
        for _ in range(2):
            v = hn.allreduce(torch.tensor([float(r)]), op=hn.Sum, process_set=even)
            if v.tolist() != [2.0]:
                fails.append(f"unnamed ps allreduce {v.tolist()}")
        if hn.allgather_object(r, process_set=even) != [0, 2]:
            fails.append("unnamed ps allgather_object")
        hn.barrier(process_set=even)
        try:
            hn.broadcast(torch.ones(1), root_rank=1, process_set=even, name="ps.badroot")
            fails.append("root outside the set accepted")
        except ConfigError as exc:
            if "root_rank=1" not in str(exc):
                fails.append(f"bad root message: {exc}")
        try:
            hn.allreduce(torch.ones(1), process_set=solo, name="ps.notmember")
            fails.append("op on a set this rank is not in accepted")
        except ConfigError as exc:
            if f"rank {r} is not a member" not in str(exc):
                fails.append(f"non-member message: {exc}")
    else:
        v = hn.allreduce(torch.tensor([5.0]), op=hn.Sum, process_set=solo, name="ps.solo")
        if v.tolist() != [5.0] or even.rank() != -1:
            fails.append(f"solo set {v.tolist()}")
    # the global set still works, concurrently named ops in different sets do not clash
    v = hn.allreduce(torch.ones(1), op=hn.Sum, name="global.after")
    if v.tolist() != [3.0]:
        fails.append(f"global after ps {v.tolist()}")
    v = hn.allreduce(torch.ones(1), op=hn.Sum).tolist()
    if v != [3.0] or hn.allgather_object(r) != [0, 1, 2]:
        fails.append(f"unnamed global ops after unnamed ps ops {v}")
    try:
        hn.add_process_set([0, 7])
        fails.append("rank 7 accepted")
    except ConfigError:
        pass
    if not hn.remove_process_set(even):
        fails.append("remove_process_set returned False")
    try:
        hn.allreduce(torch.ones(1), process_set=even, name="ps.removed")
        fails.append("op on a removed set accepted")
    except ConfigError:
        pass
    hn.shutdown()
    return fails


def mismatches() -> list[str]:
    """Shape, dtype, op and root mismatches: CollectiveError on every rank; the engine
    keeps working afterwards. Returns the error messages seen on this rank."""
    import hora.native as hn
    from hora.errors import CollectiveError, ConfigError

    hn.init()
    r = hn.rank()
    msgs: list[str] = []
    cases = [
        ("shape", lambda: hn.allreduce(torch.ones(2 + r), name="bad.shape")),
        ("dtype", lambda: hn.allreduce(torch.ones(2, dtype=torch.float32 if r else torch.float64), name="bad.dtype")),
        ("op", lambda: hn.allreduce(torch.ones(2), op=hn.Sum if r else hn.Max, name="bad.op")),
        ("root", lambda: hn.broadcast(torch.ones(2), root_rank=r, name="bad.root")),
        ("kind", lambda: (hn.allreduce if r else hn.allgather)(torch.ones(2), name="bad.kind")),
        ("allgather_rest", lambda: hn.allgather(torch.ones(1, 2 + r), name="bad.ag")),
    ]
    for what, fn in cases:
        try:
            fn()
            msgs.append(f"NO ERROR for {what}")
        except CollectiveError as exc:
            msgs.append(str(exc))
    # the engine is still usable, also for a name that was cached before
    for i in range(2):
        v = hn.allreduce(torch.ones(2), op=hn.Sum, name="good.after")
        if v.tolist() != [float(hn.size())] * 2:
            msgs.append(f"NO RECOVERY: {v.tolist()}")
    # a cached name re-submitted with another shape on one rank
    try:
        hn.allreduce(torch.ones(2 if r else 3), op=hn.Sum, name="good.after")
        msgs.append("NO ERROR for cached shape change")
    except CollectiveError as exc:
        msgs.append(str(exc))
    # duplicate in-flight names are refused on the submitting rank (a ValueError, as Horovod's)
    h = hn.allreduce_async(torch.ones(1), name="dup")
    try:
        hn.allreduce_async(torch.ones(1), name="dup")
        msgs.append("NO ERROR for duplicate name")
    except ConfigError as exc:
        msgs.append(str(exc))
    h.synchronize()
    hn.shutdown()
    return msgs


def out_of_order(n_tensors: int = 60) -> dict[str, Any]:
    """Each rank submits the same names in a different (rank-seeded) order."""
    import random

    import hora.native as hn

    hn.init()
    r, n = hn.rank(), hn.size()
    names = [f"ooo.{i}" for i in range(n_tensors)]
    random.Random(r).shuffle(names)
    ok = True
    for step in range(3):
        hs = {}
        for nm in names:
            i = int(nm.split(".")[1])
            hs[nm] = hn.allreduce_async(torch.full((i + 1,), float(r + i)), op=hn.Sum, name=nm)
            if i % 7 == r:
                time.sleep(0.001)
        for nm in reversed(names):
            i = int(nm.split(".")[1])
            if hs[nm].synchronize().tolist() != [float(sum(k + i for k in range(n)))] * (i + 1):
                ok = False
    stats = hn.engine_stats()
    hn.shutdown()
    return {"ok": ok, "order": names[:5], "stats": stats}


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def stall(late_rank: int, delay: float, shutdown_time: bool, steady: int = 0) -> dict[str, Any]:
    """``late_rank`` submits 'late.tensor' ``delay`` seconds after the others (after
    ``steady`` steps of it in lockstep: then the late step is a predicted round)."""
    import hora.native as hn
    from hora.errors import CollectiveError

    handler = _ListHandler()
    logging.getLogger("hora.native.engine").addHandler(handler)
    hn.init()
    r = hn.rank()
    out: dict[str, Any] = {}
    for _ in range(steady):
        hn.allreduce(torch.ones(2), op=hn.Sum, name="late.tensor")
    out["steady_stats"] = hn.engine_stats()
    t0 = time.monotonic()
    if r == late_rank:
        time.sleep(delay)
    h = hn.allreduce_async(torch.ones(2), op=hn.Sum, name="late.tensor")
    if not shutdown_time and r != late_rank:
        try:  # a synchronize timeout names the tensor and who never submitted it
            h.synchronize(timeout=1.5)
        except CollectiveError as exc:
            out["timeout"] = str(exc)
    try:
        out["value"] = h.synchronize().tolist()
    except CollectiveError as exc:
        out["error"] = str(exc)
    if shutdown_time:  # meet the late rank at the barrier without stalling again
        time.sleep(max(0.0, t0 + delay - time.monotonic()))
    hn.barrier()
    out["warnings"] = [m for m in handler.messages if "stall" in m]
    t1 = time.monotonic()
    out["stats"] = hn.engine_stats()
    hn.shutdown()
    out["t"] = (round(t1 - t0, 2), round(time.monotonic() - t1, 2))
    return out


def fused_vs_unfused() -> dict[str, Any]:
    """Random int and float tensors reduced fused (grouped, async) and one at a time."""
    import hora.native as hn

    hn.init()
    r = hn.rank()
    shapes = torch.Generator().manual_seed(99)  # same shapes on every rank
    g = torch.Generator().manual_seed(1234 + r)  # different values per rank
    sizes = [int(x) for x in torch.randint(1, 300, (80,), generator=shapes)]
    ints = [torch.randint(-1000, 1000, (sizes[k],), generator=g, dtype=torch.int64 if k % 2 else torch.int32)
            for k in range(40)]
    floats = [torch.randn(sizes[40 + k], generator=g) for k in range(40)]
    before = hn.engine_stats().get("fused_batches", 0)
    fused_i = hn.grouped_allreduce(ints, op=hn.Sum, name="fi")
    fused_f = hn.grouped_allreduce(floats, op=hn.Average, name="ff")
    hs = [hn.allreduce_async(t, op=hn.Max, name=f"fmax.{k}") for k, t in enumerate(ints)]
    fused_max = [h.synchronize() for h in hs]
    after = hn.engine_stats().get("fused_batches", 0)
    single_i = [hn.allreduce(t, op=hn.Sum, name=f"si.{k}") for k, t in enumerate(ints)]
    single_f = [hn.allreduce(t, op=hn.Average, name=f"sf.{k}") for k, t in enumerate(floats)]
    single_max = [hn.allreduce(t, op=hn.Max, name=f"smax.{k}") for k, t in enumerate(ints)]
    hn.shutdown()
    return {
        "ints_equal": all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(fused_i, single_i)),
        "max_equal": all(torch.equal(a, b) for a, b in zip(fused_max, single_max)),
        "floats_close": all(torch.allclose(a, b, atol=1e-6) for a, b in zip(fused_f, single_f)),
        "fused_batches": after - before,
    }


def cache_counters(steps: int, n_tensors: int) -> dict[str, Any]:
    import hora.native as hn

    hn.init()
    r, n = hn.rank(), hn.size()
    hist = []
    ok = True
    for step in range(steps):
        hs = [hn.allreduce_async(torch.full((3,), float(step + r)), op=hn.Sum, name=f"c.{i}")
              for i in range(n_tensors)]
        ok &= all(h.synchronize().tolist() == [float(sum(step + k for k in range(n)))] * 3 for h in hs)
        s = hn.engine_stats()
        hist.append((s.get("cache_hits", 0), s.get("cache_misses", 0)))
    s = hn.engine_stats()
    hn.shutdown()
    return {"ok": ok, "hist": hist, "stats": s}


def timeline_job(path: str) -> dict[str, Any]:
    import hora.native as hn

    hn.init()
    for step in range(3):
        hs = [hn.allreduce_async(torch.ones(64), name=f"tl.{i}") for i in range(8)]
        [h.synchronize() for h in hs]
        hn.broadcast(torch.ones(4), root_rank=0, name="tl.bc")
    hn.shutdown()
    return {"exists": os.path.exists(path)}


def autotune_job(steps: int) -> dict[str, Any]:
    import hora.native as hn

    handler = _ListHandler()
    handler.setLevel(logging.INFO)
    lg = logging.getLogger("hora.native.engine")
    lg.addHandler(handler)
    lg.setLevel(logging.INFO)
    hn.init()
    r, n = hn.rank(), hn.size()
    ok = True
    for step in range(steps):
        hs = [hn.allreduce_async(torch.full((256,), float(r)), op=hn.Sum, name=f"at.{i}") for i in range(4)]
        ok &= all(h.synchronize()[0].item() == float(sum(range(n))) for h in hs)
    stats = hn.engine_stats()
    hn.shutdown()
    return {"ok": ok, "log": [m for m in handler.messages if "autotune" in m], "stats": stats}


def big_allreduce(numel: int) -> bool:
    """One tensor larger than the fusion threshold plus small ones around it."""
    import hora.native as hn

    hn.init()
    r, n = hn.rank(), hn.size()
    big = torch.full((numel,), float(r + 1))
    small = [torch.full((10,), float(r)) for _ in range(5)]
    hs = [hn.allreduce_async_(big, op=hn.Sum, name="big")] + [
        hn.allreduce_async_(t, op=hn.Sum, name=f"small.{i}") for i, t in enumerate(small)]
    [h.synchronize() for h in hs]
    ok = bool(torch.all(big == float(sum(range(1, n + 1))))) and all(
        bool(torch.all(t == float(sum(range(n))))) for t in small)
    hn.shutdown()
    return ok


def small_cache_and_big_tensor() -> dict[str, Any]:
    return {"cache": cache_counters(4, 12), "big": big_allreduce(50_000)}


def rounds_per_op(ops: int, late_rank: int, delay: float) -> dict[str, Any]:
    """Grouped synchronous allreduces where ``late_rank`` always arrives ``delay`` s late.

    Returns the engine rounds spent per op: the engine must not poll the job in rounds
    while ranks wait for a late peer, nor linger in empty rounds after every op.
    """
    import hora.native as hn

    hn.init()
    r = hn.rank()
    ts = [torch.full((n,), float(r + 1)) for n in (256, 4096, 25000)]
    hn.grouped_allreduce(ts, op=hn.Sum, name="warm")  # negotiated by name once, then cached
    hn.barrier()
    before = hn.engine_stats().get("rounds", 0)
    ok = True
    for _ in range(ops):
        if r == late_rank:
            time.sleep(delay)
        outs = hn.grouped_allreduce(ts, op=hn.Sum, name="g")
        ok = ok and all(float(o[0]) == sum(k + 1 for k in range(hn.size())) for o in outs)
    rounds = hn.engine_stats().get("rounds", 0) - before
    hn.shutdown()
    return {"ok": ok, "rounds_per_op": rounds / ops}


def process_set_repeated_and_early_shutdown(steps: int) -> dict:
    """3 ranks: ranks 0 and 1 reduce the same name on a process set ``steps`` times
    (cached after the first) while rank 2, outside the set, shuts down at once."""
    import time

    import hora.native as hn

    hn.init()
    pair = hn.add_process_set([0, 1])
    out: dict = {"values": [], "seconds": []}
    if hn.rank() in (0, 1):
        for i in range(steps):
            t0 = time.perf_counter()
            v = hn.allreduce(torch.tensor([float(hn.rank() + i)]), op=hn.Sum, name="pair.x", process_set=pair)
            out["seconds"].append(time.perf_counter() - t0)
            out["values"].append(v.item())
        time.sleep(1.0)  # rank 2 has long called shutdown by now
        v = hn.allreduce(torch.tensor([1.0]), op=hn.Sum, name="pair.late", process_set=pair)
        out["late"] = v.item()
    out["cache_hits"] = hn.engine_stats().get("cache_hits", 0)
    hn.shutdown()
    return out


def _steady_disrupted_steady(step: Callable[[int, bool], None], steps: int) -> tuple[dict, dict]:
    """``steps`` steady steps, one disrupted step (``step(i, True)``), ``steps`` more; the
    engine stats after the first steady ones and at the end."""
    import hora.native as hn

    for i in range(steps):
        step(i, False)
    steady = hn.engine_stats()
    step(steps, True)
    for i in range(steps + 1, 2 * steps + 1):
        step(i, False)
    return steady, hn.engine_stats()


def speculation_job(steps: int) -> dict[str, Any]:
    """Steady rounds of a fused Average (float32) and a fused Sum (float64), then a step in
    which rank 1 submits the predicted set in pieces (blocking in between): the round is
    mispredicted on one rank and must still give exact results; then steady again."""
    import hora.native as hn

    hn.init()
    r, n = hn.rank(), hn.size()
    fails: list[str] = []

    def step(i: int, split: bool) -> None:
        a = [torch.full((5, 3), float(r + i + k)) for k in range(4)]
        b = [torch.full((7,), float(10 * r + i + k), dtype=torch.float64) for k in range(3)]
        if split and r == 1:
            # rank 1 blocks on the first tensor before submitting the rest: rank 0 holds
            # the whole prediction, rank 1 does not
            first = hn.allreduce_async_(a[0], op=hn.Average, name="sp.a.0")
            first.synchronize()
            hs = [hn.allreduce_async_(t, op=hn.Average, name=f"sp.a.{k}") for k, t in enumerate(a) if k]
        else:
            hs = [hn.allreduce_async_(t, op=hn.Average, name=f"sp.a.{k}") for k, t in enumerate(a)]
        [h.synchronize() for h in hs]
        hs = [hn.allreduce_async_(t, op=hn.Sum, name=f"sp.b.{k}") for k, t in enumerate(b)]
        [h.synchronize() for h in hs]
        for k, t in enumerate(a):
            want = sum(q + i + k for q in range(n)) / n
            if not torch.equal(t, torch.full((5, 3), float(want))):
                fails.append(f"step {i} a.{k}: {t.flatten()[:3].tolist()} != {want}")
        for k, t in enumerate(b):
            want = float(sum(10 * q + i + k for q in range(n)))
            if not torch.equal(t, torch.full((7,), want, dtype=torch.float64)):
                fails.append(f"step {i} b.{k}: {t[:3].tolist()} != {want}")

    steady, s = _steady_disrupted_steady(step, steps)
    hn.shutdown()
    return {"fails": fails, "steady": steady, "stats": s}


def many_small_predicted(steps: int, inplace: bool, disrupt: str) -> dict[str, Any]:
    """Steady steps of 200 small (3, 5) float32 tensors reduced by name (out of place or in
    place, Average), then a step disrupted on rank 1 (``"order"``: it submits them in
    reverse order; ``"late"``: it blocks on the first before submitting the rest), then
    steady again. Exact results every step; torch's ``==`` against None (which the round
    must never use on tensors: each call goes through torch) is counted in the steady
    steps."""
    import hora.native as hn

    hn.init()
    r, n = hn.rank(), hn.size()
    fails: list[str] = []
    eq_none = [0]
    plain_eq = torch.Tensor.__eq__

    def counting_eq(self: torch.Tensor, other: Any) -> Any:
        if other is None:
            eq_none[0] += 1
        return plain_eq(self, other)

    f = hn.allreduce_async_ if inplace else hn.allreduce_async

    def step(i: int, disrupted: bool) -> None:
        ts = [torch.full((3, 5), float(r + i + k)) for k in range(200)]
        order = list(enumerate(ts))
        if disrupted and r == 1 and disrupt == "order":
            order.reverse()
        if disrupted and r == 1 and disrupt == "late":
            f(ts[0], op=hn.Average, name="ms.0").synchronize()
            order = order[1:]
        hs = {k: f(t, op=hn.Average, name=f"ms.{k}") for k, t in order}
        got = {k: h.synchronize() for k, h in hs.items()}
        for k, t in enumerate(ts):
            res = t if inplace else got.get(k, t)
            want = sum(q + i + k for q in range(n)) / n
            if not torch.equal(res, torch.full((3, 5), float(want))):
                fails.append(f"step {i} ms.{k}: {res.flatten()[:3].tolist()} != {want}")
            if not inplace and k in got and got[k] is t:
                fails.append(f"step {i} ms.{k}: out of place gave the input back")

    torch.Tensor.__eq__ = counting_eq
    try:
        steady, s = _steady_disrupted_steady(step, steps)
    finally:
        torch.Tensor.__eq__ = plain_eq
    hn.shutdown()
    return {"fails": fails, "steady": steady, "stats": s, "eq_none": eq_none[0]}


def caller_runs_predicted_round(steps: int) -> dict[str, Any]:
    """Steady submit-then-synchronize steps; returns the engine stats and any wrong result."""
    import time

    import hora.native as hn

    hn.init()
    r, n = hn.rank(), hn.size()
    fails = []
    for i in range(steps):
        time.sleep(0.05)  # the engine is back in its gather before this step submits
        ts = [torch.full((100,), float(r + i + k)) for k in range(3)]
        hs = [hn.allreduce_async_(t, op=hn.Sum, name=f"cr.{k}") for k, t in enumerate(ts)]
        [h.synchronize() for h in hs]
        for k, t in enumerate(ts):
            if not torch.equal(t, torch.full((100,), float(sum(q + i + k for q in range(n))))):
                fails.append((i, k, t[0].item()))
    s = hn.engine_stats()
    hn.shutdown()
    return {"fails": fails, "stats": s}


def lone_tensor_predictions(steps: int) -> dict[str, Any]:
    """The same single small tensor, then the same single 2 MiB tensor, reduced ``steps`` times."""
    import hora.native as hn

    hn.init()
    n = hn.size()
    small, big = torch.ones(1024), torch.ones(512 * 1024)
    for _ in range(steps):
        hn.allreduce_(small, op=hn.Sum, name="lone.small")
    after_small = hn.engine_stats().get("speculation_hits", 0)
    for _ in range(steps):
        hn.allreduce_(big, op=hn.Sum, name="lone.big")
    after_big = hn.engine_stats().get("speculation_hits", 0)
    ok = torch.equal(small, torch.full((1024,), float(n**steps))) and torch.equal(
        big, torch.full((512 * 1024,), float(n**steps)))
    hn.shutdown()
    return {"small": after_small, "big": after_big - after_small, "ok": ok}


def optimizer_buckets_become_rounds(steps: int) -> dict[str, Any]:
    """DistributedOptimizer over a model of two DDP-style buckets (1 MiB, then the rest);
    backward pauses 50 ms between them, as a long backward would."""
    import time

    import hora.torch as hvd

    class _SlowBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            time.sleep(0.05)
            return g

    class _Pause(torch.nn.Module):
        def forward(self, x):
            return _SlowBackward.apply(x)

    hvd.init()
    torch.manual_seed(0)
    layers: list = [torch.nn.Linear(256, 256) for _ in range(8)]
    model = torch.nn.Sequential(*layers[:4], _Pause(), *layers[4:])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), first_bucket_mb=1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(hvd.rank()))
    per_step = []
    import hora.native as hn

    for _ in range(steps):
        before = hn.engine_stats().get("speculation_hits", 0)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        per_step.append(hn.engine_stats().get("speculation_hits", 0) - before)
    stats = hn.engine_stats()
    weights = [p.detach().clone() for p in model.parameters()]
    hvd.shutdown()
    return {"buckets": len(opt._hora_buckets), "per_step": per_step, "stats": stats,
            "checksum": float(sum(w.double().sum() for w in weights))}


def room_rounds_survive_a_misprediction(steps: int) -> dict[str, Any]:
    """Buckets with spare room (``ops.bucket_allreduce_async_``), Average then Sum, reduced
    in place by predicted rounds; then a step in which the last rank runs another op
    first, so the other ranks hold the prediction and it does not: the round misses
    after the holders have already summed their tensors in place, and the results must
    still be exact. Then steady again, twice with another op submitted alongside (the
    round is then no longer "alone"). Also: a room that is too small is refused."""
    import hora.native as hn
    from hora.errors import ConfigError
    from hora.native import ops

    hn.init()
    r, n = hn.rank(), hn.size()
    numel = 1000
    extra = ops.room_elements()
    rooms = {op: torch.empty(numel + extra) for op in ("avg", "sum")}
    fails: list[str] = []

    def step(i: int, late: bool) -> None:
        extra = i in (steps + 2, steps + 3)
        for op, room in rooms.items():  # one round each
            room[:numel] = torch.arange(numel, dtype=torch.float32) + float(r + i)
            late_here = late and op == "avg"
            if extra and op == "sum":  # ready with the prediction: the round is not "alone"
                x = torch.full((5,), float(r))
                hx = hn.allreduce_async_(x, op=hn.Sum, name="room.extra")
            if late_here and r == n - 1:
                hn.allreduce(torch.ones(3), op=hn.Sum, name="room.other")  # blocks until all ran it
            h = ops.bucket_allreduce_async_(room, numel, op=hn.Average if op == "avg" else hn.Sum,
                                            name=f"room.{op}")
            if late_here and r != n - 1:
                hn.allreduce(torch.ones(3), op=hn.Sum, name="room.other")
            h.synchronize()
            if extra and op == "sum":
                hx.synchronize()
                if not torch.equal(x, torch.full((5,), float(sum(range(n))))):
                    fails.append(f"step {i} extra: {x.tolist()}")
        base = torch.arange(numel, dtype=torch.float32)
        want_sum = base * n + float(sum(q + i for q in range(n)))
        for op, want in (("sum", want_sum), ("avg", want_sum / n)):
            got = rooms[op][:numel]
            if not torch.equal(got, want):
                fails.append(f"step {i} {op}: {got[:3].tolist()} != {want[:3].tolist()}")

    steady, s = _steady_disrupted_steady(step, steps)
    try:
        ops.bucket_allreduce_async_(torch.empty(numel + extra - 1), numel, name="room.small")
        refused = ""
    except ConfigError as exc:
        refused = str(exc)
    hn.shutdown()
    return {"fails": fails, "steady": steady, "stats": s, "refused": refused}


def end_burst_negotiates_at_once() -> dict[str, Any]:
    """With a 300 ms cycle a burst is gathered until 300 ms pass without a submission;
    ``ops.end_burst()`` ends the gathering at once."""
    import time

    import hora.native as hn
    from hora.native import ops

    hn.init()
    hn.barrier()
    out = {}
    for mode in ("plain", "end_burst"):
        a = torch.ones(8)
        ha = hn.allreduce_async_(a, op=hn.Sum, name=f"eb.{mode}.a")
        if mode == "end_burst":
            ops.end_burst()
        time.sleep(0.15)
        out[mode] = ha.poll()  # reduced while the caller did other work?
        hb = hn.allreduce_async_(torch.ones(8), op=hn.Sum, name=f"eb.{mode}.b")
        ha.synchronize()
        hb.synchronize()
        out[f"{mode}_ok"] = a.tolist() == [float(hn.size())] * 8
        hn.barrier()
    hn.shutdown()
    return out


def shm_backend_job(mode: str) -> dict[str, Any]:
    """The Gloo backend's shared-memory allreduce, driven directly (no engine).

    mode "values": every dtype and reduce op at sizes around the chunk and piece
    boundaries, against the exact result and against Gloo's; "late": rank 1 never calls,
    rank 0 must fail naming it; "gone": rank 1 closes its end, rank 0 must fail at once.
    """
    from hora.errors import CollectiveError
    from hora.native.backends import create_backend
    from hora.native.backends.base import ReduceOp
    from hora.native.backends.shm import DTYPES as SHM_DTYPES

    be, _, closers = create_backend()
    try:
        r, n = be.rank, be.size
        shm = be.world.shm
        out: dict[str, Any] = {"shm": shm is not None, "kind": type(shm).__name__}
        if mode == "values":
            fails: list[str] = []
            ops = {ReduceOp.Sum: lambda v: v.sum(0), ReduceOp.Min: lambda v: v.min(0).values,
                   ReduceOp.Max: lambda v: v.max(0).values, ReduceOp.Product: lambda v: v.prod(0)}
            for dtype in sorted(SHM_DTYPES, key=str):
                if not (shm is not None and shm.supports(torch.ones(1, dtype=dtype), ReduceOp.Sum)
                        or be.supports_reduce(dtype, ReduceOp.Sum)):
                    continue  # Gloo cannot, on its own or across hosts (the engine upcasts those)
                for op, ref in ops.items():
                    for numel in (0, 1, 7, 1000, 100_003):
                        # small integers 1..4: every result is exact in every dtype
                        vals = torch.stack([(torch.arange(numel, dtype=torch.float64) * (k + 1) + k) % 4 + 1
                                            for k in range(n)])
                        mine = vals[r].to(dtype, copy=True)
                        via_gloo = mine.clone()
                        be.allreduce(mine, op, be.world)
                        want = ref(vals).to(dtype)
                        if not torch.equal(mine, want):
                            fails.append(f"{dtype} {op!r} {numel}: wrong values")
                        if dtype == torch.int16:  # Gloo has no int16 reduction
                            continue
                        be._gloo_allreduce(via_gloo, op, be.world)
                        if not torch.equal(mine, via_gloo):
                            fails.append(f"{dtype} {op!r} {numel}: differs from Gloo")
            out["fails"] = fails
            be.barrier(be.world)  # every member is long past its set-up
            local = getattr(shm, "local", shm)  # a hierarchical reducer's on this host
            out["pieces"] = local.pieces if local else 0
            out["left_in_dev_shm"] = [f for p in (local.paths if local else []) for f in (p, p + ".sock")
                                      if os.path.exists(f)]
        elif mode == "late":
            if r == 0:
                t0 = time.monotonic()
                try:
                    be.allreduce(torch.ones(10), ReduceOp.Sum, be.world)
                    out["error"] = None
                except CollectiveError as exc:
                    out["error"] = str(exc)
                out["waited"] = time.monotonic() - t0
            else:
                time.sleep(float(os.environ["HORA_COLLECTIVE_TIMEOUT"]) + 3)
        elif mode == "gone":
            if r == 1:
                shm.close()  # as a process that died: the kernel closes its sockets
            else:
                time.sleep(0.5)
                try:
                    be.allreduce(torch.ones(10), ReduceOp.Sum, be.world)
                    out["error"] = None
                except CollectiveError as exc:
                    out["error"] = str(exc)
                try:  # and every later call says so too, instead of reading stale bytes
                    be.allreduce(torch.ones(10), ReduceOp.Sum, be.world)
                    out["again"] = None
                except CollectiveError as exc:
                    out["again"] = str(exc)
        return out
    finally:
        be.shutdown()
        for c in closers:
            c.close()


def unnamed_ops_between_steps(steps: int, between: str) -> dict[str, Any]:
    """Steady steps of 6 named gradients-like tensors, with an unnamed op between steps
    (``between``: "allreduce", an unnamed metric allreduce; "barrier"; "grouped", an
    unnamed grouped allreduce); returns exact-result failures and the stats before and
    after the steps, and when each rank entered and left a last barrier (wall clock)."""
    import time

    import hora.native as hn

    hn.init()
    r, n = hn.rank(), hn.size()
    fails: list[str] = []
    capacity_used = []
    out: dict[str, Any] = {}
    for i in range(steps):
        ts = [torch.full((64,), float(r + i + k)) for k in range(6)]
        hs = [hn.allreduce_async_(t, op=hn.Sum, name=f"un.{k}") for k, t in enumerate(ts)]
        [h.synchronize() for h in hs]
        for k, t in enumerate(ts):
            want = float(sum(q + i + k for q in range(n)))
            if not torch.equal(t, torch.full((64,), want)):
                fails.append(f"step {i} un.{k}: {t[0].item()} != {want}")
        if between == "allreduce":
            got = hn.allreduce(torch.tensor([float(r + i)]), op=hn.Sum)
            if got.item() != float(sum(q + i for q in range(n))):
                fails.append(f"step {i} metric: {got.item()}")
        elif between == "grouped":
            got = hn.grouped_allreduce([torch.ones(3) * r, torch.ones(2)], op=hn.Sum)
            if got[0].tolist() != [float(sum(range(n)))] * 3 or got[1].tolist() != [float(n)] * 2:
                fails.append(f"step {i} grouped: {[g.tolist() for g in got]}")
        else:
            hn.barrier()
        capacity_used.append(hn.engine_stats().get("cache_size", 0))
        if i == 5:
            out["steady_from"] = hn.engine_stats()
    out["stats"] = hn.engine_stats()
    if r == 1:
        time.sleep(1.0)  # the last barrier: rank 1 comes late
    out["entered"] = time.time()
    hn.barrier()
    out["left"] = time.time()
    out.update(fails=fails, cache_sizes=capacity_used)
    hn.shutdown()
    return out


def small_allgathers(sizes: list[int]) -> dict[str, Any]:
    """Allgathers of ``sizes`` elements per rank over several dtypes, each rank's values
    its own; returns the wrong results and how many allgathers went through Gloo."""
    import hora.native as hn
    from hora.native.backends import gloo

    through_gloo = []
    orig = gloo.GlooBackend._wait

    def counting(work: Any, what: str, group: Any) -> None:
        if what == "allgather":
            through_gloo.append(what)
        orig(work, what, group)

    gloo.GlooBackend._wait = staticmethod(counting)
    hn.init()
    r, n = hn.rank(), hn.size()
    fails: list[str] = []
    for numel in sizes:
        for dtype in (torch.uint8, torch.int8, torch.int16, torch.int64, torch.float16, torch.bfloat16,
                      torch.float32, torch.float64, torch.bool):
            g = torch.Generator().manual_seed(100 * r + numel)
            if dtype == torch.bool:
                mine = torch.rand(numel, generator=g) > 0.5
            elif dtype.is_floating_point:
                mine = (torch.randn(numel, generator=g) * 1e3).to(dtype)
            else:
                mine = torch.randint(-100 if dtype != torch.uint8 else 0, 100, (numel,), generator=g).to(dtype)
            got = hn.allgather(mine.view(numel, 1), name=f"ag.{numel}.{dtype}")
            theirs = []
            for q in range(n):
                gq = torch.Generator().manual_seed(100 * q + numel)
                if dtype == torch.bool:
                    theirs.append(torch.rand(numel, generator=gq) > 0.5)
                elif dtype.is_floating_point:
                    theirs.append((torch.randn(numel, generator=gq) * 1e3).to(dtype))
                else:
                    theirs.append(torch.randint(-100 if dtype != torch.uint8 else 0, 100, (numel,),
                                                generator=gq).to(dtype))
            want = torch.cat(theirs).view(n * numel, 1)
            if got.dtype != dtype or not torch.equal(got.view(torch.uint8) if dtype == torch.bool else got,
                                                     want.view(torch.uint8) if dtype == torch.bool else want):
                fails.append(f"{numel} x {dtype}")
    hn.shutdown()
    return {"fails": fails, "through_gloo": len(through_gloo)}
