"""The key protocol: the name of every key that ranks, task supervisors and launchers
write to a job's key-value stores, owned by this one module.

A job has one authenticated :class:`~hora.native.rendezvous.RendezvousServer` (in the
launcher for ``hora run`` and the local/ssh launchers, in the driver service of
:func:`hora.runners.run`). Two families of keys live there:

* the collective core's: barriers (``barrier/<name>/<rank>``), the job's generation
  counter ``hora/native/<job>/generation`` (rank 0 opens each generation,
  ``hora/native/<job>/generation/<gen>``, at its ``init()``) and, per generation, the
  start barrier ``hora/native/<job>/<gen>/init`` and the address of the collective store
  ``hora/native/<job>/<gen>/collective_store``;
* the launcher's (``runner/...``): which ranks started, heartbeats, output batches,
  metrics, failure reports (ordered by one counter), results and the abort flag;
* elastic ``hora run``'s (``elastic/...``): which workers left a round, their places in
  the next one, and the host changes of the current one.

Launchers read what ranks write only through the functions here (a launcher that
waits for stragglers at the engine's start barrier asks :func:`parse_native_init`
which keys those are, instead of guessing from names), so the two sides cannot drift.
Nothing here imports torch or does I/O.
"""

from __future__ import annotations

from typing import NamedTuple

# ---------------------------------------------------------------------------------------
# the collective core
# ---------------------------------------------------------------------------------------
BARRIER = "barrier/"
NATIVE = "hora/native/"


class BarrierArrival(NamedTuple):
    """One rank's arrival at a barrier: ``barrier/<name>/<rank>``."""

    name: str
    rank: int


class NativeInit(NamedTuple):
    """The engine's start barrier of one ``init()``: ``hora/native/<job_id>/<generation>/init``."""

    job_id: str
    generation: int


def barrier_key(name: str, rank: int) -> str:
    """The key rank ``rank`` sets when it reaches the barrier ``name``."""
    return f"{BARRIER}{name}/{rank}"


def parse_barrier_key(key: str) -> BarrierArrival | None:
    """``barrier/<name>/<rank>`` as ``(name, rank)``; None for any other key."""
    if not key.startswith(BARRIER):
        return None
    name, sep, rank_s = key[len(BARRIER):].rpartition("/")
    if not sep or not name or not rank_s.isdigit():
        return None
    return BarrierArrival(name, int(rank_s))


def native_generation(job_id: str) -> str:
    """The counter of the job's generations (rank 0 adds one at each ``init()``)."""
    return f"{NATIVE}{job_id}/generation"


def native_generation_open(job_id: str, generation: int) -> str:
    """Set by rank 0 once it has opened ``generation`` (the other ranks wait for it)."""
    return f"{NATIVE}{job_id}/generation/{generation}"


def native_init_barrier(job_id: str, generation: int) -> str:
    """The barrier every rank meets at the start of its ``generation``-th ``init()``."""
    return f"{NATIVE}{job_id}/{generation}/init"


def native_collective_store(job_id: str, generation: int) -> str:
    """The key under which rank 0 publishes the collective store's ``host:port``."""
    return f"{NATIVE}{job_id}/{generation}/collective_store"


def parse_native_init(barrier_name: str) -> NativeInit | None:
    """``(job_id, generation)`` when ``barrier_name`` is the engine's start barrier, else None."""
    if not barrier_name.startswith(NATIVE) or not barrier_name.endswith("/init"):
        return None
    job_id, sep, gen_s = barrier_name[len(NATIVE):-len("/init")].rpartition("/")
    if not sep or not job_id or not gen_s.lstrip("-").isdigit():
        return None
    return NativeInit(job_id, int(gen_s))


# ---------------------------------------------------------------------------------------
# the launcher (driver service)
# ---------------------------------------------------------------------------------------
RUNNER = "runner/"
STARTED = "runner/started/"  # runner/started/<rank> = the rank's host
HEARTBEAT = "runner/hb/"  # runner/hb/<rank> = a counter
LOG = "runner/log/"  # runner/log/<rank>/<seq> = pickled list of (stream, line)
METRICS = "runner/metrics/"  # runner/metrics/<rank> = pickled (seq, dict)
FAILED = "runner/failed/"  # runner/failed/<rank> = pickled FailureReport
FAILSEQ = "runner/failseq"  # the counter that orders failures (reports and observed exits)
DONE = "runner/done/"  # runner/done/<rank>: fn returned
EXITED = "runner/exited/"  # runner/exited/<rank>: a task supervisor's rank processes are gone
TASK_HELLO = "runner/task_hello/"  # runner/task_hello/<stage>/<rank> = a Spark task's host (JSON)
TASK_DONE = "runner/task_done/"  # runner/task_done/<rank>: a Spark task is done with rank 0's rendezvous server
RESULT = "runner/result/"  # runner/result/<rank> = chunk count; runner/result/<rank>/<i> = chunk i
SPEC = "runner/spec"  # the pickled (LaunchSpec, None) for ranks that fetch it (under mpiexec)
ABORT = "runner/abort"  # set by the driver: every rank stops


# ---------------------------------------------------------------------------------------
# elastic membership (``hora run --host-discovery-script``: hora.runners.elastic and its workers)
# ---------------------------------------------------------------------------------------
ELASTIC = "elastic/"
ELASTIC_HOSTS = "elastic/hosts"  # pickled HostsUpdate: the hosts changed during a round


def elastic_ready_key(round_: int, worker: str) -> str:
    """Set by ``worker`` when it left round ``round_`` to reset (it waits for its next assignment)."""
    return f"{ELASTIC}ready/{round_}/{worker}"


def elastic_ready_prefix(round_: int) -> str:
    """The prefix of every worker's ready key of round ``round_``."""
    return f"{ELASTIC}ready/{round_}/"


def elastic_assign_key(round_: int, worker: str) -> str:
    """``worker``'s place in round ``round_`` (a pickled assignment, or the exit marker)."""
    return f"{ELASTIC}assign/{round_}/{worker}"


def rank_key(prefix: str, rank: int) -> str:
    """``<prefix><rank>`` for the per-rank prefixes above."""
    return f"{prefix}{rank}"


def rank_of(prefix: str, key: str) -> int | None:
    """The rank of a per-rank key ``<prefix><rank>``; None if ``key`` is not one."""
    if not key.startswith(prefix):
        return None
    rest = key[len(prefix):]
    return int(rest) if rest.isdigit() else None


def log_key(rank: int, seq: int) -> str:
    """The key of a rank's ``seq``-th batch of output lines."""
    return f"{LOG}{rank}/{seq:09d}"


def parse_log_key(key: str) -> tuple[int, int] | None:
    """``(rank, seq)`` of an output batch key; None for any other key."""
    if not key.startswith(LOG):
        return None
    rank_s, _, seq_s = key[len(LOG):].partition("/")
    if not rank_s.isdigit() or not seq_s.isdigit():
        return None
    return int(rank_s), int(seq_s)


def result_chunk_key(rank: int, index: int) -> str:
    """The key of chunk ``index`` of a rank's pickled result."""
    return f"{RESULT}{rank}/{index}"


__all__ = [
    "BarrierArrival", "NativeInit", "barrier_key", "parse_barrier_key", "native_generation",
    "native_generation_open", "native_init_barrier",
    "native_collective_store", "parse_native_init", "rank_key", "rank_of", "log_key", "parse_log_key",
    "result_chunk_key", "STARTED", "HEARTBEAT", "LOG", "METRICS", "FAILED", "FAILSEQ", "DONE", "EXITED", "RESULT",
    "SPEC", "ABORT", "ELASTIC", "ELASTIC_HOSTS", "elastic_ready_key", "elastic_ready_prefix", "elastic_assign_key",
]
