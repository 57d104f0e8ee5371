"""Finding the rank processes of a run (the chaos soak's and the tests' checks that nothing is left)."""

from __future__ import annotations

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


def ranks_under(pids: list[int]) -> list[psutil.Process]:
    """The ``hora.runners.rank.main`` processes below the processes ``pids`` (e.g. the ranks of
    the Dask workers started from the command line)."""
    found = []
    for pid in pids:
        try:
            for child in psutil.Process(pid).children(recursive=True):
                try:
                    if "hora.runners.rank.main" in " ".join(child.cmdline()):
                        found.append(child)
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
    return found


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
