"""Helpers shared by the runner tests."""

from __future__ import annotations

import time

import psutil


WARM_SERVER = "hora.runners.rank.warm.server"


def hora_worker_processes(marker: str | None = None) -> list[psutil.Process]:
    """Live ``hora.runners.rank.main`` processes (whose command line contains ``marker``, if given).

    A rank forked by a warm server shows the command line of the fresh rank it stands for; the
    marker is usually the run id, which a rank's command line carries in its result path
    (local ranks: ``<tmp>/hora-<run id>-*/rank.<r>.pkl``; Spark and Dask: ``hora-<run id>-rank<r>-*``)."""
    out = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if "hora.runners.rank.main" in cmd and (marker is None or marker in cmd):
                if proc.info["status"] != psutil.STATUS_ZOMBIE:
                    out.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def rank_processes_in(folder: str) -> list[psutil.Process]:
    """Live rank-side processes (``hora.runners.rank.*``: ranks, and on ssh hosts the supervisors
    ssh started) whose working folder is under ``folder``: how the ranks of ``hora run -H`` hosts,
    which carry no run id on their command line, are found. Not the warm rank servers
    (``hora.runners.rank.warm.server``): a launching process's pool, not a job's, which forks
    the local ranks (those show the rank's own command line) and outlives the job."""
    out = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if "hora.runners.rank." in cmd and WARM_SERVER not in cmd and \
                    proc.info["status"] != psutil.STATUS_ZOMBIE and proc.cwd().startswith(folder):
                out.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def assert_no_workers_left(marker: str, within: float = 10.0) -> None:
    """Fail unless every worker process of the run ``marker`` is gone within ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        left = hora_worker_processes(marker)
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"orphan worker processes of {marker}: {[p.pid for p in left]}")
        time.sleep(0.2)


def interrupt_when_files_exist(paths: list[str], timeout: float = 120.0):
    """Start a thread that raises KeyboardInterrupt in the main thread once every path exists."""
    import _thread
    import os
    import threading

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(os.path.exists(p) for p in paths):
                _thread.interrupt_main()
                return
            time.sleep(0.1)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def touch_and_sleep(out_dir: str) -> None:
    """A rank body: announce that this rank is inside fn, then sleep."""
    import os

    open(os.path.join(out_dir, f"in-fn.{os.environ['HORA_RANK']}"), "w").close()
    time.sleep(300)


def relaunch_lines(caplog) -> list[str]:
    """One line per relaunch that ``hora.runners.driver.recovery`` logged: the attempt's failure
    and the relaunch, joined by `` / ``."""
    out, failed = [], None
    for record in caplog.records:
        if record.name != "hora.runners.driver.recovery":
            continue
        message = record.getMessage()
        if "relaunching" in message:
            out.append(f"{failed} / {message}")
        elif " failed: " in message:
            failed = message
    return out
