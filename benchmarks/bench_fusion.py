"""Tensor fusion: 1000 tensors of 4 KiB, allreduce_async on all then synchronize (2 ranks, Gloo).

Compared in the same run with one hand-fused allreduce of the same bytes, written the
plain way (``torch.cat`` of flattened views, one torch.distributed ``all_reduce``, a loop
of ``copy_`` back: the baseline of the goal) and the tightest way (``cat(out=)`` into a
preallocated buffer and one ``_foreach_copy_`` back), and with the raw all_reduce of an
already flat buffer. Also reports the engine's steady-state overhead per step (hora step time
minus the hand-fused time) with and without the response cache.

    python benchmarks/bench_fusion.py [--tensors 1000] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _native_common import machine_note, run_local, table, timeit  # noqa: E402


def worker(n_tensors: int, numel: int, steps: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    import hora.native as hn
    from _native_common import raw_gloo_group

    store = raw_gloo_group()
    tensors = [torch.full((numel,), 1.0) for _ in range(n_tensors)]
    flat = torch.empty(n_tensors * numel)
    res: dict[str, float] = {}

    def hand_fused() -> None:
        fused = torch.cat([t.view(-1) for t in tensors])
        dist.all_reduce(fused)
        for t, part in zip(tensors, fused.split([t.numel() for t in tensors])):
            t.copy_(part.view_as(t))

    def hand_fused_tight() -> None:
        torch.cat(tensors, out=flat)
        dist.all_reduce(flat)
        torch._foreach_copy_(tensors, list(flat.split(numel)))

    def raw_flat() -> None:
        dist.all_reduce(flat)

    def hora_step() -> None:
        hs = [hn.allreduce_async_(t, op=hn.Sum, name=f"f.{i}") for i, t in enumerate(tensors)]
        for h in hs:
            h.synchronize()

    hn.init()
    first = time.perf_counter()
    hora_step()  # first step: every name negotiated in full
    res["hora_first_step"] = time.perf_counter() - first
    for label in ("a", "b"):  # interleave so both see the same machine load
        res[f"hand_{label}"] = timeit(hand_fused, steps, warmup=2, barrier=dist.barrier)
        res[f"tight_{label}"] = timeit(hand_fused_tight, steps, warmup=2, barrier=dist.barrier)
        res[f"raw_{label}"] = timeit(raw_flat, steps, warmup=2, barrier=dist.barrier)
        res[f"hora_{label}"] = timeit(hora_step, steps, warmup=2, barrier=dist.barrier)
    s = hn.engine_stats()
    res["cache_hits"] = s.get("cache_hits", 0)
    hn.shutdown()
    os.environ["HORA_CACHE_CAPACITY"] = "0"
    hn.init()
    res["hora_nocache"] = timeit(hora_step, steps, warmup=2, barrier=dist.barrier)
    res["hand_c"] = timeit(hand_fused, steps, warmup=2, barrier=dist.barrier)
    res["tight_c"] = timeit(hand_fused_tight, steps, warmup=2, barrier=dist.barrier)
    hn.shutdown()
    dist.destroy_process_group()
    del store
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tensors", type=int, default=1000)
    ap.add_argument("--numel", type=int, default=1024, help="float32 elements per tensor (1024 = 4 KiB)")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    note = machine_note()
    outs = run_local(worker, 2, args=(a.tensors, a.numel, a.steps))
    r = outs[0]
    hand = min(r["hand_a"], r["hand_b"])
    tight = min(r["tight_a"], r["tight_b"])
    hora = min(r["hora_a"], r["hora_b"])
    raw = min(r["raw_a"], r["raw_b"])
    hand_c = r["hand_c"]
    ms = lambda s: f"{s * 1e3:.2f}"  # noqa: E731
    rows = [
        ("hand-fused allreduce (cat + all_reduce + copy_ loop back)", ms(hand), "1.00"),
        ("hand-fused, tight (cat(out=) + all_reduce + one _foreach_copy_)", ms(tight), f"{tight / hand:.2f}"),
        ("raw all_reduce of the flat buffer (no packing)", ms(raw), f"{raw / hand:.2f}"),
        (f"hora allreduce_async x{a.tensors} + synchronize (cache)", ms(hora), f"{hora / hand:.2f}"),
        (f"hora allreduce_async x{a.tensors} + synchronize (no cache)", ms(r["hora_nocache"]),
         f"{r['hora_nocache'] / hand_c:.2f}"),
        ("hora first step (everything negotiated by name)", ms(r["hora_first_step"]),
         f"{r['hora_first_step'] / hand:.2f}"),
    ]
    print(f"## bench_fusion: {a.tensors} x {a.numel * 4 // 1024} KiB float32, 2 ranks, loopback ({note})\n")
    print(table(rows, ("variant", "ms per step (median)", "x hand-fused")))
    print()
    tight_c = r["tight_c"]
    over = [
        ("with response cache", f"{(hora - tight) * 1e6:.0f}", f"{(hora - tight) * 1e6 / a.tensors:.1f}"),
        ("without response cache", f"{(r['hora_nocache'] - tight_c) * 1e6:.0f}",
         f"{(r['hora_nocache'] - tight_c) * 1e6 / a.tensors:.1f}"),
    ]
    print(table(over, ("engine steady-state overhead", "us per step (hora - tight hand-fused)", "us per tensor")))
    goal = hora / hand <= 1.5
    print(f"\ngoal hora <= 1.5 x hand-fused: {'met' if goal else 'NOT met'} ({hora / hand:.2f}x; "
          f"{hora / tight:.2f}x the tight hand-fused version)")


if __name__ == "__main__":
    main()
