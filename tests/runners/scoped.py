"""Orphan checks that hold while other tests run beside this one (``make test`` runs two
pytest-xdist processes): the rank processes a test started are this process's descendants,
or, once their parent died without taking them along, orphans adopted by init, started after
the test began. Another pytest process's live ranks are neither."""

from __future__ import annotations

import os
import time

import psutil


def _is_orphan_or_ours(proc: psutil.Process, ours: set[int], since: float) -> bool:
    if proc.pid in ours:
        return True
    return proc.ppid() == 1 and proc.create_time() >= since


def ranks_started_here(since: float, marker: str = "hora.runners.rank.main") -> list[psutil.Process]:
    """Live ``marker`` processes that are descendants of this process, or orphans (parent:
    init) created at or after ``since`` (``time.time()``). A rank forked by a warm server shows
    a fresh rank's command line; the servers themselves (a launching process's pool, which
    outlives its jobs) are not ranks."""
    ours = {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}
    out = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if marker in cmd and "hora.runners.rank.warm.server" not in cmd and \
                    proc.info["status"] != psutil.STATUS_ZOMBIE and _is_orphan_or_ours(proc, ours, since - 1.0):
                out.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def assert_no_ranks_left_since(since: float, within: float = 10.0) -> None:
    """Fail unless every rank process this test started (see :func:`ranks_started_here`) is
    gone within ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        left = ranks_started_here(since)
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"rank processes left: {[(p.pid, p.ppid(), p.cmdline()) for p in left]}")
        time.sleep(0.2)
