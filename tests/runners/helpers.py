"""Helpers shared by the runner tests."""

from __future__ import annotations

import time

from benchmarks._common.processes import hora_worker_processes, rank_processes_in  # noqa: F401


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
