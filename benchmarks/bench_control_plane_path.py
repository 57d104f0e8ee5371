"""The rest of a collective's path at N ranks: the engine's negotiation, the collective store, Spark's barrier.

Rows for ``bench_control_plane.py --path`` (or run alone):

* ``negotiation``: the collective engine's bookkeeping of one round on one rank, when N ranks'
  metadata arrives, driven directly with N simulated ranks' requests (no processes, no network):
  *by name* (no response cache: the allgathered payload of every rank decoded by
  :func:`hora.native.engine.negotiation.exchange`, then :meth:`Negotiator.process_metas`), and
  *cached* (the steady state with the response cache: the requests matched to their slots, the
  control vector encoded and decoded, the LRU touched), and a *predicted* round in place (the vote
  written as the tail in the tensor's spare room, with one holder element per rank, and read back).
  The allgather and the allreduces themselves are communication and are not in the figure.
* ``tcpstore``: the rendezvous of the collective groups through torch's ``TCPStore`` as hora's
  Gloo backend uses it (rank 0 serves it; every rank opens two clients, ``main`` and ``waiter``),
  N ranks as threads: the time for all to connect, for each to publish its address under its
  rank, and the reads of a full mesh (each rank reads every other rank's address: N x (N - 1)
  gets), timed on a sample of ranks and scaled when N x (N - 1) exceeds ``--mesh-gets``.
* ``spark``: a ``local[N]`` SparkSession: the slots it offers (``defaultParallelism``) and the
  time to run a barrier stage of N no-op tasks (each calls ``BarrierTaskContext.barrier()``).

    python benchmarks/bench_control_plane_path.py [--ranks 64,1024,4096] [--tensors 64]
        [--store-ranks 64,256,1024] [--spark 2,8,32] [--only negotiation,tcpstore,spark]
"""

from __future__ import annotations

import argparse
import datetime
import pickle
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load_now, table  # noqa: E402


# ------------------------------------------------------------------------------------------
# the engine's negotiation
# ------------------------------------------------------------------------------------------
class _Gathered:
    """A backend whose allgather hands back N ranks' prepared buffer (what the network would)."""

    def __init__(self, size: int, raw: torch.Tensor) -> None:
        self.size = size
        self.world = None
        self._raw = raw

    def allgather(self, out: torch.Tensor, inp: torch.Tensor, group: Any) -> None:
        out.copy_(self._raw)


def _requests(tensors: int) -> list[Any]:
    from hora.native.backends.base import ReduceOp
    from hora.native.engine.request import fast_allreduce_request

    return [fast_allreduce_request(f"grad.{i}", torch.ones(16 + i), None, ReduceOp.Sum, 1.0, 1.0)
            for i in range(tensors)]


def negotiation_round(n: int, tensors: int, rounds: int) -> tuple[float, float, float, float]:
    """Median seconds of one round's bookkeeping on rank 0 of ``n``: by name, cached; the
    longest by-name round (the first one pays for the table's growth); a predicted round."""
    import numpy as np

    from hora.native.engine.cache import ResponseCache
    from hora.native.engine.control import ControlVector
    from hora.native.engine.negotiation import Negotiator, ProcessSetInfo, exchange

    reqs = _requests(tensors)
    # -- by name: every rank's metadata allgathered and taken in
    payload = pickle.dumps([(r.name, r.key, r.local) for r in reqs], protocol=pickle.HIGHEST_PROTOCOL)
    width = len(payload) + 4
    one = np.zeros(width, dtype=np.uint8)
    one[:4] = np.frombuffer(len(payload).to_bytes(4, "big"), dtype=np.uint8)
    one[4:] = np.frombuffer(payload, dtype=np.uint8)
    backend = _Gathered(n, torch.from_numpy(np.tile(one, n)))
    neg = Negotiator(0, n, {0: ProcessSetInfo(0, range(n), None)}, ResponseCache(0))  # type: ignore[arg-type]
    by_name = []
    for i in range(rounds):
        t = time.perf_counter()
        metas = exchange(backend, payload, len(payload))  # type: ignore[arg-type]
        ready: list[Any] = []
        errors: dict[str, str] = {}
        neg.process_metas(metas, i, i + 1, ready, errors)
        ready.sort(key=lambda r: r.seq)
        by_name.append(time.perf_counter() - t)
        if len(ready) != tensors or errors or neg.table:
            raise RuntimeError(f"{n} ranks: {len(ready)} of {tensors} ready, errors {errors}")
    # -- cached: the same requests, every one already in the cache (every rank submitted it)
    cache = ResponseCache(1024)
    for r in ready:
        cache.put(r.name, r.key, r.locals)
    cv = ControlVector(cache.capacity)
    cached = []
    for i in range(rounds):
        t = time.perf_counter()
        bits = []
        for req in reqs:  # (the loop's match of a fresh request to its slot)
            e = cache.by_name.get(req.name)
            if e is None or e.locals is None or e.locals.get(0) != req.local \
                    or not (e.key is req.key or e.key == req.key):
                raise RuntimeError(f"{req.name} not cached")
            bits.append(e.slot)
        ctrl = cv.encode(bits, [], False, 0, True, i, 2**31 - 1, False, True)
        # (here the MIN allreduce of every rank's vector: communication, not timed)
        flags = cv.flags(ctrl)
        entries = [cache.slots[s] for s in cv.ready_slots(ctrl)]
        cv.partial_slots(ctrl)
        cache.touch_all([e.slot for e in entries if e is not None])
        cached.append(time.perf_counter() - t)
        if len(entries) != tensors or flags.any_uncached:
            raise RuntimeError(f"{n} ranks: {len(entries)} of {tensors} cached responses ready")
    # -- predicted: the steady state with predicted rounds (speculation), in place: the vote rides
    # the tensor's spare room as a tail, with a holders section of one element per rank
    from hora.native.engine.control import Vote

    used = cache.slots_in_use()
    vote = Vote(bits, [], False, 0, True, 0, 2**31 - 1, False, True)
    tail = np.zeros(cv.tail_size(used, n, True), dtype=np.float32)
    predicted = []
    for i in range(rounds):
        t = time.perf_counter()
        cv.tail_of(vote._replace(now_ms=i), used, tail, rank=0, size=n, have=True, alone=True, inplace=True)
        # (here the SUM allreduce of the tensor and its tail: communication, not timed)
        cv.tail_pure(tail, used, n)
        predicted.append(time.perf_counter() - t)
    return statistics.median(by_name), statistics.median(cached), max(by_name), statistics.median(predicted)


def negotiation_rows(ranks: list[int], tensors: int, rounds: int) -> list[list[str]]:
    rows, prev = [], None
    for n in ranks:
        by_name, cached, worst, predicted = negotiation_round(n, tensors, rounds)
        growth = ("by name: N x tensors keys unpickled and tallied; cached: no term in N; predicted: "
                  "one holder element per rank" if prev is None else
                  f"by name {by_name / prev[1]:.1f} x for {n / prev[0]:.0f} x the ranks; cached "
                  f"{cached / prev[2]:.1f} x")
        rows.append([f"negotiation, {n:,} ranks, {tensors} tensors",
                     f"{by_name * 1e3:.2f} ms (worst {worst * 1e3:.2f})",
                     f"{cached * 1e3:.3f} ms (predicted round, in place: {predicted * 1e3:.3f} ms)", growth,
                     load_now()])
        prev = (n, by_name, cached)
    return rows


# ------------------------------------------------------------------------------------------
# the collective groups' TCPStore
# ------------------------------------------------------------------------------------------
def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def tcpstore_round(n: int, mesh_gets: int, mesh_bytes: int, addr_bytes: int, limit: float) -> dict[str, Any]:
    """N ranks (threads) through one TCPStore as hora's Gloo backend uses it; seconds per phase."""
    import torch.distributed as dist

    td = datetime.timedelta(seconds=limit)
    server = dist.TCPStore("127.0.0.1", 0, None, True, td, wait_for_workers=False)
    port = server.port
    clients: list[Any] = [None] * n
    failed: list[str] = []

    def connect(rank: int) -> None:
        try:  # hora's make_stores: a main client and a waiter per rank
            clients[rank] = (dist.TCPStore("127.0.0.1", port, None, False, td),
                             dist.TCPStore("127.0.0.1", port, None, False, td))
        except Exception as exc:  # noqa: BLE001 (reported in the row)
            failed.append(f"rank {rank}: {exc}")

    def run(target: Any, ranks: list[int]) -> float:
        t = time.perf_counter()
        threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in ranks]
        for th in threads:
            th.start()
        for th in threads:
            th.join(max(0.0, limit - (time.perf_counter() - t)))
        return time.perf_counter() - t

    out: dict[str, Any] = {"n": n, "connect": run(connect, list(range(n)))}
    if failed or any(c is None for c in clients):
        out["error"] = f"{sum(c is not None for c in clients)} of {n} connected after {out['connect']:.1f} s " \
                       f"({failed[:1]})"
        return out
    value = bytes(addr_bytes * (n - 1))  # gloo: one key per rank, the addresses of its N - 1 pairs

    def publish(rank: int) -> None:
        main = clients[rank][0]
        main.set(f"hora/pg/world/rank_{rank}", b"127.0.0.1")
        main.set(f"hora/pg/world/{rank}", value)

    out["publish"] = run(publish, list(range(n)))
    # the full mesh: each rank reads every other rank's host name and pair addresses (a sample, scaled)
    per_rank = (n - 1) * (len(value) + 9)
    sample = max(1, min(n, mesh_gets // (2 * (n - 1)), mesh_bytes // per_rank))
    readers = list(range(0, n, max(1, n // sample)))[:sample]

    def read_all(rank: int) -> None:
        main = clients[rank][0]
        for peer in range(n):
            if peer != rank:
                main.get(f"hora/pg/world/rank_{peer}")
                main.get(f"hora/pg/world/{peer}")

    took = run(read_all, readers)
    out["mesh"] = took * n / len(readers)
    out["mesh_measured"] = len(readers)
    out["gets_per_s"] = 2 * len(readers) * (n - 1) / took
    out["mesh_gb"] = n * per_rank / 1e9
    del clients, server
    return out


def tcpstore_rows(ranks: list[int], mesh_gets: int, mesh_bytes: int, addr_bytes: int,
                  limit: float) -> list[list[str]]:
    _raise_fd_limit()
    rows = []
    for n in ranks:
        r = tcpstore_round(n, mesh_gets, mesh_bytes, addr_bytes, limit)
        if "error" in r:
            rows.append([f"TCPStore, {n:,} ranks (threads)", r["error"], "-", "-", load_now()])
            break
        scaled = "" if r["mesh_measured"] == n else f", scaled from {r['mesh_measured']} ranks' reads"
        rows.append([f"TCPStore, {n:,} ranks (threads)",
                     f"connect {r['connect']:.2f} s, publish {r['publish']:.2f} s",
                     f"full-mesh reads {r['mesh']:.1f} s ({r['mesh_gb']:.2f} GB{scaled}; "
                     f"{r['gets_per_s']:,.0f} gets/s)",
                     "2 N (N - 1) gets, N (N - 1)^2 addresses read, through one server", load_now()])
    return rows


# ------------------------------------------------------------------------------------------
# Spark's barrier stage
# ------------------------------------------------------------------------------------------
def spark_rows(ranks: list[int], limit: float) -> list[list[str]]:
    from pyspark.sql import SparkSession

    def task(it: Any) -> list[int]:  # (nested: shipped by value, the workers need not import this file)
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        ctx.barrier()
        return [ctx.partitionId()]

    rows, prev = [], None
    for n in ranks:
        t = time.perf_counter()
        spark = (SparkSession.builder.master(f"local[{n}]").appName(f"bench-barrier-{n}")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.network.timeout", f"{int(limit)}s").getOrCreate())
        started = time.perf_counter() - t
        try:
            sc = spark.sparkContext
            sc.setLogLevel("ERROR")
            slots = sc.defaultParallelism
            times = []
            for _ in range(3):  # the first stage starts the Python workers
                t = time.perf_counter()
                got = sc.parallelize(range(n), n).barrier().mapPartitions(task).collect()
                times.append(time.perf_counter() - t)
                if sorted(got) != list(range(n)):
                    raise RuntimeError(f"local[{n}]: barrier stage returned {got}")
                if times[-1] > limit:
                    break
        finally:
            spark.stop()
        nxt = statistics.median(times[1:]) if len(times) > 1 else float("nan")
        growth = ("first stage: a Python worker started per task" if prev is None else
                  f"first {times[0] / prev[1]:.1f} x, next {nxt / prev[2]:.1f} x for {n / prev[0]:.0f} x the tasks")
        rows.append([f"Spark barrier stage, local[{n}]: {slots} slots, {n} tasks", f"first stage {times[0]:.2f} s",
                     f"next {nxt:.2f} s (session start {started:.1f} s)", growth, load_now()])
        prev = (n, times[0], nxt)
    return rows


HEADER = ("row", "by name / phase 1", "cached / phase 2", "growth", "load 1/5/15")


def path_rows(args: argparse.Namespace) -> list[list[str]]:
    """The rows of the sections named by ``--only``, each printed as it is measured."""
    only = set(args.only.split(","))
    sections = []
    if "negotiation" in only:
        sections.append(lambda: negotiation_rows([int(x) for x in args.ranks.split(",")], args.tensors, args.rounds))
    if "tcpstore" in only:
        sections.append(lambda: tcpstore_rows([int(x) for x in args.store_ranks.split(",")], args.mesh_gets,
                                              args.mesh_bytes, args.addr_bytes, args.limit))
    if "spark" in only and args.spark:
        sections.append(lambda: spark_rows([int(x) for x in args.spark.split(",")], args.limit))
    rows: list[list[str]] = []
    for section in sections:
        new = section()
        print(table([tuple(r) for r in new], HEADER).split("\n", 2)[2], flush=True)
        rows += new
    return rows


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--tensors", type=int, default=64, help="named allreduces per round (negotiation)")
    ap.add_argument("--rounds", type=int, default=9, help="rounds timed per N (negotiation)")
    ap.add_argument("--store-ranks", default="64,256,1024", help="comma-separated N for the TCPStore rows")
    ap.add_argument("--mesh-gets", type=int, default=200_000, help="most full-mesh gets timed per N (then scaled)")
    ap.add_argument("--mesh-bytes", type=int, default=2_000_000_000,
                    help="most full-mesh bytes read per N (then scaled)")
    ap.add_argument("--addr-bytes", type=int, default=136, help="bytes of one pair's address in a gloo key")
    ap.add_argument("--spark", default="2,8,32", help="comma-separated N for local[N] barrier stages ('' : none)")
    ap.add_argument("--limit", type=float, default=120.0, help="seconds any one phase may take")
    ap.add_argument("--only", default="negotiation,tcpstore,spark")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="64,1024,4096", help="comma-separated N for the negotiation rows")
    add_arguments(ap)
    args = ap.parse_args()
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", flush=True)
    print(table([tuple(r) for r in path_rows(args)], HEADER), flush=True)


if __name__ == "__main__":
    main()
