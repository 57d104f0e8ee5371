"""How long a trivial run takes end to end, with today's polls against the slower polls before them
(same process, alternated): the rendezvous server looking for ``stop()`` every
``SHUTDOWN_POLL_S`` (0.05 s, was 0.2 s) and the driver checking a function run's ranks every
``Policy.poll_interval`` (0.05 s, was 0.1 s). Every run, fit and test job pays its end once.

    python benchmarks/bench_run_end.py [--runs 15] [--np 2] [--compare polls|host-beats]

Prints the median and best wall time of ``hora.runners.run(noop, num_proc=np)`` (local launcher,
warm ranks) for each setting and their ratio. ``--compare host-beats`` alternates instead every
rank beating on its own (``HORA_HOST_BEATS=0``) with the host's ranks beating through one relay
(:mod:`hora.runners.rank.relay`, the default), both with today's polls.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load_now, machine_note, table  # noqa: E402

OLD = {"shutdown_poll": 0.2, "check_poll": 0.1}
NEW = {"shutdown_poll": 0.05, "check_poll": 0.05}


def noop() -> int:
    return 0


def _settings(shutdown_poll: float, check_poll: float) -> None:
    from hora.native.rendezvous import server
    from hora.runners import api
    from hora.runners.driver.monitor import Policy

    server.SHUTDOWN_POLL_S = shutdown_poll
    api.Policy = functools.partial(Policy, poll_interval=check_poll)


def _one_run(np_: int, env: dict[str, str] | None = None) -> float:
    import hora.runners as hr

    t0 = time.perf_counter()
    hr.run(noop, num_proc=np_, verbose=0, env=env)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--compare", choices=("polls", "host-beats"), default="polls")
    a = ap.parse_args()
    print(f"# {machine_note()}; {a.np} ranks, {a.runs} runs per setting, alternated", flush=True)
    if a.compare == "host-beats":
        _compare_host_beats(a.runs, a.np)
        return
    times: dict[str, list[float]] = {"before (0.2 / 0.1 s)": [], "now (0.05 / 0.05 s)": []}
    for name, cfg in zip(times, (OLD, NEW)):  # one warm-up run each (the warm rank server starts)
        _settings(**cfg)
        _one_run(a.np)
    for _ in range(a.runs):
        for name, cfg in zip(times, (OLD, NEW)):
            _settings(**cfg)
            times[name].append(_one_run(a.np))
    base = statistics.median(times["before (0.2 / 0.1 s)"])
    rows = [(name, f"{statistics.median(t) * 1e3:.0f}", f"{min(t) * 1e3:.0f}", f"{statistics.median(t) / base:.2f}")
            for name, t in times.items()]
    print(f"\nload {load_now()}")
    print(table(rows, ("polls (server stop / driver check)", "median ms", "best ms", "x before")))


def _compare_host_beats(runs: int, np_: int) -> None:
    _settings(**NEW)
    envs = {"each rank beats (HORA_HOST_BEATS=0)": {"HORA_HOST_BEATS": "0"},
            "one frame per host (HORA_HOST_BEATS=1)": {"HORA_HOST_BEATS": "1"}}
    times: dict[str, list[float]] = {name: [] for name in envs}
    for env in envs.values():  # one warm-up run each (the warm rank server starts)
        _one_run(np_, env)
    for _ in range(runs):
        for name, env in envs.items():
            times[name].append(_one_run(np_, env))
    base = statistics.median(next(iter(times.values())))
    rows = [(name, f"{statistics.median(t) * 1e3:.0f}", f"{min(t) * 1e3:.0f}", f"{statistics.median(t) / base:.2f}")
            for name, t in times.items()]
    print(f"\nload {load_now()}")
    print(table(rows, ("heartbeats", "median ms", "best ms", "x each rank")))


if __name__ == "__main__":
    main()
