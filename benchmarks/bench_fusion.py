"""Tensor fusion: 1000 tensors of 4 KiB, ``allreduce_async`` on each then ``synchronize``
on each (2 ranks, loopback), the way Horovod code reduces many small tensors.

Compared in the same run, interleaved, with one hand-fused allreduce of the same bytes
written the plain way (``torch.cat``, one ``torch.distributed.all_reduce``, a loop of
``copy_`` back: the goal's baseline) and the tightest way (``cat(out=)`` into a
preallocated buffer and one ``_foreach_copy_`` back), with the raw all_reduce of an
already flat buffer, and with hora's own allreduce of one tensor of the same bytes.

The hora rows: out of place (``allreduce_async(t, name=...)``, Horovod's call: a new
tensor per result) and in place (``allreduce_async_``), with the response cache (the
steady state) and without, and the first step (every name negotiated).

Per stage (rank 0, per tensor): the caller's time submitting, the caller's time in the
synchronize loop, and the CPU time of the whole step per tensor (all threads: caller and
engine) against the hand-fused step's. The engine's steady-state overhead per tensor is
(hora's step - hora's step of one tensor of the same bytes - what packing costs by hand
(the tight step's ``cat(out=)`` and ``_foreach_copy_`` into views it keeps, timed alone))
/ tensors: what having many tensors costs beyond moving their bytes, on the same wire.
(Runs before 2026-12-02 split the views anew inside the packing they subtracted, which
took a view's making, about 1 us a tensor, off hora's overhead; both are printed.)

Floors, measured in the same run: the least any engine written in Python does per
tensor (a handle filed by name under a lock, completed, synchronized; no checks, no
communication); the same with the checks hora must make of every op (the tensor's type,
device, dtype, layout and autograd, the name, the key of shape, dtype and op that ranks
agree on, a name already in flight); and what a new result tensor costs (out of place;
one batched clone). Bookkeeping plus the new tensor is what an out-of-place op costs at
least, on this machine, in Python: the first without checks, the second with hora's.

The engine's cache holds every name the script uses (``HORA_CACHE_CAPACITY``), so every
"cache" row is the steady state. The variants run interleaved, ``--rounds`` times
``--steps`` steps each; a row is the median over all its steps, and the overhead and its
ratios are also taken per round (each against the floors of the same round) and their
median reported, which keeps a drift of the machine within the run out of the ratio.

    python benchmarks/bench_fusion.py [--tensors 1000] [--steps 10] [--rounds 5]

The last lines are the goal rows of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import GOAL_HEADER, goal_row, load_now, machine_note, run_local, table  # noqa: E402


def worker(n_tensors: int, numel: int, steps: int, rounds: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    import hora.native as hn
    from _common import raw_gloo_group

    store = raw_gloo_group()
    tensors = [torch.full((numel,), 1.0) for _ in range(n_tensors)]
    flat = torch.empty(n_tensors * numel)
    one = torch.ones(n_tensors * numel)
    res: dict[str, list[float]] = {}
    stage: dict[str, list[float]] = {}

    def hand_fused() -> None:
        fused = torch.cat([t.view(-1) for t in tensors])
        dist.all_reduce(fused)
        for t, part in zip(tensors, fused.split([t.numel() for t in tensors])):
            t.copy_(part.view_as(t))

    # the tight hand-written step keeps its views of the flat buffer (as hora keeps its
    # views of the fusion buffer): splitting a thousand views costs more than the copy
    views = list(flat.split(numel))

    def hand_fused_tight() -> None:
        torch.cat(tensors, out=flat)
        dist.all_reduce(flat)
        torch._foreach_copy_(tensors, views)

    def raw_flat() -> None:
        dist.all_reduce(flat)

    def packing() -> None:  # what the tight hand-fused step does besides its collective
        torch.cat(tensors, out=flat)
        torch._foreach_copy_(tensors, views)

    def packing_split() -> None:  # the same, its views split anew (how earlier runs timed packing)
        torch.cat(tensors, out=flat)
        torch._foreach_copy_(tensors, list(flat.split(numel)))

    def hora_oop() -> None:
        t0 = time.thread_time()
        hs = [hn.allreduce_async(t, op=hn.Sum, name=f"o.{i}") for i, t in enumerate(tensors)]
        t1 = time.thread_time()
        for h in hs:
            h.synchronize()
        stage.setdefault("submit", []).append(t1 - t0)
        stage.setdefault("sync", []).append(time.thread_time() - t1)

    one = torch.ones(1)

    def hora_oop_metric() -> None:
        # the same step, then an unnamed allreduce of a metric (Horovod code logging its
        # loss): a made-up name every step, negotiated by name
        hs = [hn.allreduce_async(t, op=hn.Sum, name=f"o.{i}") for i, t in enumerate(tensors)]
        for h in hs:
            h.synchronize()
        hn.allreduce(one, op=hn.Sum)

    def hora_inplace() -> None:
        hs = [hn.allreduce_async_(t, op=hn.Sum, name=f"f.{i}") for i, t in enumerate(tensors)]
        for h in hs:
            h.synchronize()

    def hora_one() -> None:
        hn.allreduce_async_(one, op=hn.Sum, name="one").synchronize()

    # The floor of any engine written in Python, on this machine, in this run: per tensor
    # the least such an engine does (a call that makes a handle and files it by name
    # under a lock for the thread that runs the rounds, a completion that takes it out
    # and marks it done, the caller's synchronize), with no check and no communication;
    # and what a new tensor per result costs (out of place), made in one batched call.
    import threading

    class FloorHandle:
        __slots__ = ("name", "tensor", "key", "done", "result")

        def synchronize(self) -> torch.Tensor:
            return self.result

    lock, filed, keys = threading.Lock(), {}, {}
    floor_names = [f"p.{i}" for i in range(n_tensors)]

    def floor_submit(t: torch.Tensor, name: str) -> FloorHandle:
        h = FloorHandle()
        h.name, h.tensor, h.done = name, t, False
        k = (t.shape, t.dtype)
        h.key = keys.get(k) or keys.setdefault(k, k)
        with lock:
            filed[name] = h
        return h

    def python_floor() -> None:
        hs = [floor_submit(t, nm) for t, nm in zip(tensors, floor_names)]
        with lock:
            for h in hs:
                del filed[h.name]
                h.result = h.tensor
                h.done = True
        for h in hs:
            h.synchronize()

    def new_tensors() -> None:
        torch._foreach_clone(tensors)

    # the same floor with the checks every op needs (hora's fast path makes these): the
    # tensor can be reduced here, its name is a string, its key (what ranks agree on) comes
    # from a dict of keys, and a name already in flight is refused
    numeric = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64,
                         torch.int8, torch.uint8, torch.int16})
    checked_keys: dict = {}
    in_flight: dict = {}
    adasum = hn.Adasum

    def checked_submit(t, op=hn.Average, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None,
                       compression=None) -> FloorHandle:
        if not (type(t) is torch.Tensor and process_set is None and compression is None and op is not adasum
                and t.is_cpu and not t.requires_grad and t.is_contiguous()):
            raise ValueError("not the fast path")
        dtype = t.dtype
        if dtype not in numeric or type(name) is not str or not name:
            raise ValueError("not the fast path")
        k = (t.shape, dtype, op)
        key = checked_keys.get(k)
        if key is None:
            key = checked_keys[k] = (tuple(t.shape), str(dtype), op)
        h = FloorHandle()
        h.name, h.tensor, h.key, h.done = name, t, key, False
        with lock:
            if in_flight.setdefault(name, h) is not h:
                raise ValueError(f"{name} in flight")
        return h

    def checked_floor() -> None:
        hs = [checked_submit(t, op=hn.Sum, name=nm) for t, nm in zip(tensors, floor_names)]
        pop = in_flight.pop
        with lock:
            for h in hs:
                pop(h.name)
                h.result = h.tensor
                h.done = True
        for h in hs:
            h.synchronize()

    fns = {"hand": hand_fused, "tight": hand_fused_tight, "raw": raw_flat, "packing": packing,
           "packing_split": packing_split, "hora_oop": hora_oop,
           "hora_oop_metric": hora_oop_metric, "hora_inplace": hora_inplace, "hora_one": hora_one,
           "python_floor": python_floor, "checked_floor": checked_floor, "new_tensors": new_tensors}
    hn.init()
    first = time.perf_counter()
    hora_oop()  # first step: every name negotiated in full
    res["hora_first_step"] = [time.perf_counter() - first]
    stage.clear()
    for f in fns.values():  # warm-up
        for _ in range(2):
            f()
    stage.clear()
    cpu: dict[str, list[float]] = {}
    per_round: list[dict[str, float]] = []
    for _ in range(rounds):  # interleaved, so that every variant sees the same machine load
        this: dict[str, list[float]] = {}
        for k, f in fns.items():
            for _ in range(steps):
                dist.barrier()
                c = time.process_time()
                t = time.perf_counter()
                f()
                res.setdefault(k, []).append(time.perf_counter() - t)
                this.setdefault(k, []).append(res[k][-1])
                cpu.setdefault(k, []).append(time.process_time() - c)
        per_round.append({k: statistics.median(v) for k, v in this.items()})
    s = hn.engine_stats()
    hn.shutdown()
    os.environ["HORA_CACHE_CAPACITY"] = "0"
    hn.init()
    for _ in range(2):
        hora_oop()
    for _ in range(max(1, rounds // 2)):
        for k, f in (("hand_c", hand_fused), ("hora_oop_nocache", hora_oop)):
            for _ in range(steps):
                dist.barrier()
                t = time.perf_counter()
                f()
                res.setdefault(k, []).append(time.perf_counter() - t)
    hn.shutdown()
    dist.destroy_process_group()
    del store
    out = {k: statistics.median(v) for k, v in res.items()}
    out.update({f"cpu_{k}": statistics.median(v) for k, v in cpu.items()})
    n_stage = steps * rounds  # (the no-cache phase appended more)
    out["stage_submit"] = statistics.median(stage["submit"][:n_stage]) if stage.get("submit") else 0.0
    out["stage_sync"] = statistics.median(stage["sync"][:n_stage]) if stage.get("sync") else 0.0
    out["cache_hits"] = s.get("cache_hits", 0)
    out["speculation_hits"] = s.get("speculation_hits", 0)
    out["rounds_matched_whole"] = s.get("rounds_matched_whole", 0)
    out["per_round"] = per_round
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tensors", type=int, default=1000)
    ap.add_argument("--numel", type=int, default=1024, help="float32 elements per tensor (1024 = 4 KiB)")
    ap.add_argument("--steps", type=int, default=10, help="steps per variant and round")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds over the variants")
    a = ap.parse_args()
    note = machine_note()
    load = load_now()
    # a cache for every name used here (o.*, f.*, one and the metric's), so that the cached
    # rows are the steady state and not a cache that evicts between variants
    env = {"HORA_CACHE_CAPACITY": str(max(1024, 2 * a.tensors + 64))}
    r = run_local(worker, 2, args=(a.tensors, a.numel, a.steps, a.rounds), env=env)[0]
    n = a.tensors
    ms = lambda s: f"{s * 1e3:.2f}"  # noqa: E731
    hand = r["hand"]
    rows = [
        ("hand-fused allreduce (cat + all_reduce + copy_ loop back)", ms(hand), "1.00"),
        ("hand-fused, tight (cat(out=) + all_reduce + one _foreach_copy_)", ms(r["tight"]), f"{r['tight'] / hand:.2f}"),
        ("raw all_reduce of the flat buffer (no packing)", ms(r["raw"]), f"{r['raw'] / hand:.2f}"),
        ("packing by hand alone (cat(out=) + one _foreach_copy_ into kept views, no collective)", ms(r["packing"]),
         f"{r['packing'] / hand:.2f}"),
        ("the same, the views split anew each step", ms(r["packing_split"]), f"{r['packing_split'] / hand:.2f}"),
        (f"hora allreduce_async(t, name=) x{n} + synchronize, new tensors (cache)", ms(r["hora_oop"]),
         f"{r['hora_oop'] / hand:.2f}"),
        ("the same, then an unnamed allreduce of one float (a metric)", ms(r["hora_oop_metric"]),
         f"{r['hora_oop_metric'] / hand:.2f}"),
        (f"hora allreduce_async_(t, name=) x{n} + synchronize, in place (cache)", ms(r["hora_inplace"]),
         f"{r['hora_inplace'] / hand:.2f}"),
        ("hora allreduce_async_ of one tensor of the same bytes", ms(r["hora_one"]), f"{r['hora_one'] / hand:.2f}"),
        (f"hora allreduce_async x{n} + synchronize, new tensors (no cache)", ms(r["hora_oop_nocache"]),
         f"{r['hora_oop_nocache'] / r['hand_c']:.2f}"),
        ("hora first step (everything negotiated by name)", ms(r["hora_first_step"]),
         f"{r['hora_first_step'] / hand:.2f}"),
    ]
    print(f"## bench_fusion: {n} x {a.numel * 4 // 1024} KiB float32, 2 ranks, loopback ({note}), "
          f"median of {a.steps * a.rounds} steps\n")
    print(table(rows, ("variant", "ms per step (median)", "x hand-fused")))
    us = lambda s: f"{s * 1e6 / n:.2f}"  # noqa: E731
    packing = r["packing"]
    overhead = r["hora_oop"] - r["hora_one"] - packing
    overhead_ip = r["hora_inplace"] - r["hora_one"] - packing
    stages = [
        ("caller: submit (allreduce_async)", us(r["stage_submit"])),
        ("caller: synchronize loop (waits for the round included)", us(r["stage_sync"])),
        ("CPU of the whole step, all threads (hora, new tensors)", us(r["cpu_hora_oop"])),
        ("CPU of the whole step, all threads (hand-fused)", us(r["cpu_hand"])),
        ("engine steady-state overhead, new tensors", us(overhead)),
        ("engine steady-state overhead, in place", us(overhead_ip)),
        ("floor of a Python engine: handle, filed by name, completed, synchronized (no checks)",
         us(r["python_floor"])),
        ("the same with hora's checks (tensor, name, key, a name in flight)", us(r["checked_floor"])),
        ("floor of a result as a new tensor (out of place; one batched clone)", us(r["new_tensors"])),
    ]
    print()
    print(table(stages, ("stage (rank 0)", "us per tensor")))
    ratio = r["hora_oop"] / hand
    print("\ngoal rows (benchmarks/README.md):\n")
    print(GOAL_HEADER)
    print(goal_row(f"{n} x 4 KiB `allreduce_async(t, name=...)` (out of place) then `synchronize` on each",
                   "`torch.cat` + one `all_reduce` + copy back (Gloo)", f"{ratio:.2f} x the time", "<= 1.2 x",
                   ratio <= 1.2, load))
    rounds = r["per_round"]
    # per round: the overhead, and the floors of the same round (their medians below)
    per_r = [(x["hora_oop"] - x["hora_one"] - x["packing"]) * 1e6 / n for x in rounds]
    bare_r = [(x["python_floor"] + x["new_tensors"]) * 1e6 / n for x in rounds]
    checked_r = [(x["checked_floor"] + x["new_tensors"]) * 1e6 / n for x in rounds]
    med = statistics.median
    per = med(per_r)
    print(goal_row("engine steady-state overhead per tensor (response cache hit)",
                   "hora's own allreduce of the same bytes as one tensor, plus packing by hand (timed alone)",
                   f"{per:.2f} us", "<= 3 us", per <= 3.0, load))
    print(f"\nper round ({len(rounds)} rounds of {a.steps} steps; medians): hora's overhead {per:.2f} us "
          f"(rounds: {', '.join(f'{v:.2f}' for v in per_r)}); the floor of a Python engine out of place, without "
          f"checks {med(bare_r):.2f} us, with hora's checks {med(checked_r):.2f} us; hora's overhead is "
          f"{med(p / b for p, b in zip(per_r, bare_r)):.2f} x the first and "
          f"{med(p / c for p, c in zip(per_r, checked_r)):.2f} x the second (per-round ratios)")
    split_r = [(x["hora_oop"] - x["hora_one"] - x["packing_split"]) * 1e6 / n for x in rounds]
    print(f"the overhead against packing that splits its views anew each step (how runs before 2026-12-02 "
          f"timed it): {med(split_r):.2f} us")
    print(f"rounds matched whole (steady state recognized without a per-request lookup): "
          f"{r['rounds_matched_whole']}")


if __name__ == "__main__":
    main()
