"""Start-up time of ``hora run`` on two ssh hosts against the same ranks on this machine.

Both runs start 4 ranks of the same script with ``hora run`` (the command users type):

* **local**: ``hora run -np 4 python rank.py`` (4 processes here);
* **2 ssh hosts**: ``hora run -np 4 -H 127.0.0.1:2,127.0.0.2:2 -p PORT -i KEY python rank.py``
  (2 processes here, 2 on "the second host" through a throwaway sshd on 127.0.0.2,
  started by this script as the tests do, via ssh and hora's host supervisor).

Start-up = from starting ``hora run`` until *every* rank has returned from
``hora.native.init()`` (each rank writes ``time.time()`` to a file then; one machine,
one clock). The two variants alternate, after one warm-up run each; the table has the
median of ``--repeats`` and the ratio ssh/local. On one machine "the second host" shares
the CPUs and the network is loopback, so the difference is what ssh and the supervisor
add (an ssh handshake, one more interpreter start), not network latency.

    python benchmarks/bench_ssh_launch.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RANK = textwrap.dedent("""
    import os, sys, time
    import hora.native as hn
    hn.init()
    with open(os.path.join(sys.argv[1], "rank." + os.environ["HORA_RANK"]), "w") as fh:
        fh.write(repr(time.time()))
    hn.shutdown()
""")


def _launch(argv: list[str], env: dict[str, str], n: int) -> float:
    with tempfile.TemporaryDirectory(prefix="hora-bench-ssh-") as out:
        script = os.path.join(out, "rank.py")
        with open(script, "w") as fh:
            fh.write(RANK)
        start = time.time()
        res = subprocess.run([sys.executable, "-m", "hora", "run", "-np", str(n), *argv, sys.executable, script, out],
                             env=env, cwd=out, capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            raise SystemExit(f"hora run failed ({res.returncode}):\n{res.stderr[-3000:]}")
        stamps = [float(Path(out, f"rank.{r}").read_text()) for r in range(n)]
    return max(stamps) - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from _common.sshd import SshdUnavailable, running_sshd

    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    times: dict[str, list[float]] = {"4 local ranks": [], "4 ranks on 2 ssh hosts": []}
    with tempfile.TemporaryDirectory(prefix="hora-bench-sshd-") as folder:
        try:
            with running_sshd(Path(folder)) as server:
                env.update(server.env)
                ssh = ["-H", "127.0.0.1:2,127.0.0.2:2", "-p", str(server.port), "-i", server.key]
                variants = {"4 local ranks": [], "4 ranks on 2 ssh hosts": ssh}
                for i in range(args.repeats + 1):
                    for name, argv in variants.items():
                        t = _launch(argv, env, 4)
                        if i > 0:  # the first round warms imports and the page cache
                            times[name].append(t)
        except SshdUnavailable as exc:
            raise SystemExit(f"needs a real sshd: {exc}") from None
    load = os.getloadavg()
    base = statistics.median(times["4 local ranks"])
    print(f"\nStart-up of 4 ranks with hora run, median of {args.repeats} (after a warm-up), "
          f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} cores:\n")
    print("| launch | median s | runs s | ratio vs local |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.2f} | {', '.join(f'{t:.2f}' for t in ts)} | {med / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
