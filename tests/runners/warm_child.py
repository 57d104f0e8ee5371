"""A rank stand-in for tests/runners/test_warm.py: ``python -m tests.runners.warm_child ACTION [N]``.

Prints one JSON line about itself (what was imported before its own first import, its
environment, cwd, process group and session), then exits with code N (``exit N``), kills
itself with signal N (``signal N``), or sleeps until it is killed (``sleep``).
"""

import sys

PRELOADED = sorted(m for m in ("torch", "torch._dynamo", "hora.native.ops") if m in sys.modules)

import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402

if __name__ == "__main__":
    line = sys.stdin.readline().strip()
    print(json.dumps({"preloaded": PRELOADED, "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
                      "cwd": os.getcwd(), "probe": os.environ.get("HORA_TEST_WARM_PROBE"), "stdin": line,
                      "random": random.random()}), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    action, arg = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
    if action == "exit":
        sys.exit(arg)
    if action == "signal":
        os.kill(os.getpid(), arg)
    while action == "sleep":
        time.sleep(1)
