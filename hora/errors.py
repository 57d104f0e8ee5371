"""Typed errors raised by hora.

Every error hora raises on purpose derives from :class:`HoraError`, so callers can
catch all of them at once, and also from the closest builtin (``ValueError`` for bad
configuration, ``RuntimeError`` for failures at run time), so code written against
builtins keeps working.
"""

from __future__ import annotations

import enum
from typing import ClassVar


class HoraError(Exception):
    """Base class of every error raised by hora."""


class ConfigError(HoraError, ValueError):
    """A parameter, argument or environment setting is invalid."""


class DataError(HoraError, ValueError):
    """Input data is unusable: missing columns, unsupported types, empty, NaN labels..."""


class NotInitializedError(HoraError, ValueError):
    """A collective was called before ``init()`` (or after ``shutdown()``)."""


class CollectiveError(HoraError, RuntimeError):
    """A collective failed, or ranks disagree about one (shape, dtype, op, process set)."""


class RendezvousError(HoraError, RuntimeError):
    """Workers could not find each other: a rank never arrived, or a key never appeared."""


class StoreError(HoraError, OSError):
    """A Store location is unknown, unreachable, unwritable, or holds inconsistent data."""


class FaultKind(enum.Enum):
    """What kind of fault a failed run's root cause is: ``(description, retriable, symptom)``.

    *Retriable*: infrastructure (the same code would have run on a healthy cluster), so a run
    with ``max_failures`` is launched again. *Symptom*: what a survivor sees when a peer is
    lost (the monitor prefers any other failure as the root cause). Each kind has its
    subclass of :class:`WorkerFailedError` (:func:`failure_class`); the table is in
    :mod:`hora.runners.driver.faults`.
    """

    SIGNAL = ("a rank was killed", True, False)
    LOST = ("a host, executor or worker was lost", True, False)
    START = ("ranks did not start", True, False)
    INFRASTRUCTURE = ("an infrastructure error", True, True)
    ERROR = ("a rank raised an error", False, False)
    EXIT = ("a rank exited with an error code", False, False)
    COLLECTIVE = ("a collective failed", False, True)
    TASK = ("an engine task failed", False, True)
    TIMEOUT = ("a timeout", False, False)

    def __init__(self, description: str, retriable: bool, symptom: bool) -> None:
        self.description = description
        self.retriable = retriable
        self.symptom = symptom

    def __repr__(self) -> str:
        return f"FaultKind.{self.name}"


class WorkerFailedError(HoraError, RuntimeError):
    """A training worker failed.

    The run's monitor raises one subclass per kind of fault (:class:`RankKilledError`,
    :class:`WorkerLostError`, ...): ``kind``, ``retriable`` and ``symptom`` are class
    attributes (None, False, False here: a failure nobody classified).

    Attributes:
        rank: the rank that failed first (``None`` when unknown).
        host: the host it ran on (``None`` when unknown).
        remote_traceback: the traceback text captured in the worker, if any.
        exitcode: the process exit code, if the worker was a process that exited.
    """

    kind: ClassVar[FaultKind | None] = None
    retriable: ClassVar[bool] = False
    symptom: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind is not None:
            cls.retriable = cls.kind.retriable
            cls.symptom = cls.kind.symptom

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        host: str | None = None,
        remote_traceback: str | None = None,
        exitcode: int | None = None,
    ) -> None:
        self.rank = rank
        self.host = host
        self.remote_traceback = remote_traceback
        self.exitcode = exitcode
        self.message = message
        text = message
        if remote_traceback:
            text = f"{message}\n\nRemote traceback (rank {rank} on {host}):\n{remote_traceback.rstrip()}"
        super().__init__(text)

    def __reduce__(self):  # keep the class and the keyword attributes through pickling
        return (_rebuild_worker_failed, (self.message, self.rank, self.host, self.remote_traceback, self.exitcode,
                                         type(self)))


def _rebuild_worker_failed(message, rank, host, remote_traceback, exitcode, cls=None):
    return (cls or WorkerFailedError)(
        message, rank=rank, host=host, remote_traceback=remote_traceback, exitcode=exitcode
    )


class RankKilledError(WorkerFailedError):
    """A rank process was killed by a signal hora did not send (the OOM killer, an operator,
    a preempting scheduler, a faulty node)."""

    kind = FaultKind.SIGNAL


class WorkerLostError(WorkerFailedError):
    """A host, Spark executor, Dask worker or Ray actor was lost (its ssh session ended,
    its heartbeats stopped, the engine reports it lost)."""

    kind = FaultKind.LOST


class RanksNotStartedError(WorkerFailedError, RendezvousError):
    """Ranks never started, or never met at the engine's start barrier, within ``start_timeout``
    (also a :class:`RendezvousError`, what the monitor raised for it before)."""

    kind = FaultKind.START


class InfrastructureError(WorkerFailedError):
    """A rank raised a rendezvous or connection error (reset, refused, broken pipe) and no
    other cause was seen."""

    kind = FaultKind.INFRASTRUCTURE


class RankError(WorkerFailedError):
    """A rank raised an exception (a bug in the training code, a bad loss, a DataError)."""

    kind = FaultKind.ERROR


class RankExitError(WorkerFailedError):
    """A rank process exited with a non-zero code without a retriable exception."""

    kind = FaultKind.EXIT


class CollectiveFailedError(WorkerFailedError):
    """A rank's collective failed with no lost rank behind it (ranks disagree about a shape,
    dtype, op or process set)."""

    kind = FaultKind.COLLECTIVE


class TaskFailedError(WorkerFailedError):
    """A Spark or Dask task failed for a reason hora cannot attribute to a lost executor or worker."""

    kind = FaultKind.TASK


class RunTimeoutError(WorkerFailedError, TimeoutError):
    """Ranks did not finish in time (``timeout`` of :func:`hora.runners.run`, or
    ``HORA_FINISH_TIMEOUT`` after another rank had already returned)."""

    kind = FaultKind.TIMEOUT


_FAILURE_CLASSES: dict[FaultKind, type[WorkerFailedError]] = {
    c.kind: c for c in (RankKilledError, WorkerLostError, RanksNotStartedError, InfrastructureError, RankError,
                        RankExitError, CollectiveFailedError, TaskFailedError, RunTimeoutError)
    if c.kind is not None
}


def failure_class(kind: FaultKind) -> type[WorkerFailedError]:
    """The subclass of :class:`WorkerFailedError` of a kind of fault."""
    return _FAILURE_CLASSES[kind]


# -- Horovod's exception names (``horovod.common.exceptions``), for programs migrated by renaming ----------

#: Horovod raises ``HorovodInternalError`` when a collective fails; in hora that is a CollectiveError.
#: ``hora.torch.elastic.run`` treats it as Horovod's elastic mode does: restore the last commit, retry.
HorovodInternalError = CollectiveError


class HostsUpdatedInterrupt(HoraError, RuntimeError):
    """The set of hosts changed during elastic training (Horovod's name and meaning).

    Attributes:
        skip_sync: ``True`` when only hosts were added and the state need not be restored
            before the next reset (Horovod's semantics).
    """

    def __init__(self, skip_sync: bool = False) -> None:
        self.skip_sync = skip_sync
        super().__init__(f"hosts were updated (skip_sync={skip_sync})")

    def __reduce__(self):
        return (HostsUpdatedInterrupt, (self.skip_sync,))


class HorovodVersionMismatchError(HoraError, ImportError):
    """A framework was imported at a version other than the one the extension needs (Horovod's name).

    hora builds no compiled extension, so it raises this only where a framework is older than
    hora supports.
    """

    def __init__(self, name: str, version: str, installed_version: str) -> None:
        self.name, self.version, self.installed_version = name, version, installed_version
        super().__init__(get_version_mismatch_message(name, version, installed_version))

    def __reduce__(self):
        return (HorovodVersionMismatchError, (self.name, self.version, self.installed_version))


def get_version_mismatch_message(name: str, version: str, installed_version: str) -> str:
    """Horovod's message for :class:`HorovodVersionMismatchError`."""
    return (f"Framework {name} installed with version {installed_version} but found version {version}; "
            f"install a supported version of {name}")


__all__ = [
    "HoraError",
    "ConfigError",
    "DataError",
    "NotInitializedError",
    "CollectiveError",
    "RendezvousError",
    "StoreError",
    "WorkerFailedError",
    "FaultKind",
    "RankKilledError",
    "WorkerLostError",
    "RanksNotStartedError",
    "InfrastructureError",
    "RankError",
    "RankExitError",
    "CollectiveFailedError",
    "TaskFailedError",
    "RunTimeoutError",
    "failure_class",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "HorovodVersionMismatchError",
    "get_version_mismatch_message",
]
