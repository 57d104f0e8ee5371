"""How many CPU threads a rank's framework uses: its share of its host's cores.

torch (and most math libraries) default to a thread per core in every process: ``k`` ranks on a
host then run ``k`` times as many compute threads as cores, and their OpenMP threads spin while
they wait for each other (a 2-rank CNN fit on 2 cores ran at a third of the rows/s it has with 1
thread a rank: ``benchmarks/bench_rank_threads.py``). The estimators apply :func:`rank_threads`
to each CPU rank's torch; ``hora run`` sets ``OMP_NUM_THREADS`` of its local ranks from it, as
``torchrun`` does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hora import settings

ENV_RANK_THREADS = "HORA_RANK_THREADS"


def host_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or a task's share)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def rank_threads(local_size: int, environ: Mapping[str, str] | None = None, cores: int | None = None) -> int | None:
    """The compute threads of a rank that shares its host with ``local_size - 1`` others, or
    None to leave the framework's own choice.

    ``HORA_RANK_THREADS`` when set above 0; else None when ``OMP_NUM_THREADS`` is set (the user's
    choice, or the cluster's: a Dask nanny sets 1, Ray a task's CPUs, Spark the executor's cores);
    else the rank's share of the host's cores, ``cores // local_size`` (at least 1).
    """
    env = os.environ if environ is None else environ
    chosen = settings.get(ENV_RANK_THREADS, env)
    if chosen:
        return int(chosen)
    if str(env.get("OMP_NUM_THREADS", "")).strip():
        return None
    return max(1, (host_cores() if cores is None else cores) // max(1, int(local_size)))


__all__ = ["ENV_RANK_THREADS", "host_cores", "rank_threads"]
