"""``hora run --warm`` against plain ``hora run``: the wall seconds of a whole run.

Run: ``.venv/bin/python benchmarks/bench_warm_command.py [--np 2] [--repeat 3]``. Prints a markdown table.
Each run is ``hora run -np N python examples/torch_synthetic.py --epochs 2`` as a subprocess of this
script, which therefore owns the warm server (as a shell would): one ``--warm`` run first starts the
server (reported on its own), then plain and ``--warm`` runs alternate; the ratio is plain / warm,
both measured here, back to back. (No CPU column: a warm rank is the server's child, and the
server, still running, has not been reaped by anyone here, so ``RUSAGE_CHILDREN`` misses it.)
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(np_: int, warm: bool) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "hora", "run", "-np", str(np_), *(["--warm"] if warm else []),
           sys.executable, os.path.join(ROOT, "examples", "torch_synthetic.py"), "--epochs", "2"]
    env = dict(os.environ, PYTHONPATH=ROOT, HORA_WARM_IDLE_TIMEOUT="120")
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"bench_warm_command.py, {started:%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} cores\n")
    first = _run(args.np, True)  # starts this process's warm server
    plain, warm = [], []
    for _ in range(args.repeat):
        plain.append(_run(args.np, False))
        warm.append(_run(args.np, True))
    p, w = statistics.median(plain), statistics.median(warm)
    print(f"| `hora run -np {args.np}` of torch_synthetic.py (2 epochs), median of {args.repeat} | wall (s) | vs plain |")
    print("|---|---:|---:|")
    print(f"| plain (a fresh interpreter per rank) | {p:.2f} | 1.00x |")
    print(f"| `--warm`, the first run (starts the server) | {first:.2f} | {p / first:.2f}x |")
    print(f"| `--warm`, later runs (fork from it) | {w:.2f} | **{p / w:.1f}x** |")
    print("\nevery pair (plain / warm wall s): " + "; ".join(f"{a:.2f} / {b:.2f}" for a, b in zip(plain, warm)))


if __name__ == "__main__":
    main()
