"""Typed errors raised by hora.

Every error hora raises on purpose derives from :class:`HoraError`, so callers can
catch all of them at once, and also from the closest builtin (``ValueError`` for bad
configuration, ``RuntimeError`` for failures at run time), so code written against
builtins keeps working.
"""

from __future__ import annotations


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


class WorkerFailedError(HoraError, RuntimeError):
    """A training worker failed.

    Attributes:
        rank: the rank that failed first (``None`` when unknown).
        host: the host it ran on (``None`` when unknown).
        remote_traceback: the traceback text captured in the worker, if any.
        exitcode: the process exit code, if the worker was a process that exited.
    """

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

    def __reduce__(self):  # keep the keyword attributes through pickling
        return (_rebuild_worker_failed, (self.message, self.rank, self.host, self.remote_traceback, self.exitcode))


def _rebuild_worker_failed(message, rank, host, remote_traceback, exitcode):
    return WorkerFailedError(
        message, rank=rank, host=host, remote_traceback=remote_traceback, exitcode=exitcode
    )


# -- Horovod's exception names (``horovod.common.exceptions``), for programs migrated by renaming ----------

#: Horovod raises ``HorovodInternalError`` when a collective fails; in hora that is a CollectiveError.
#: ``hora.torch.elastic.run`` treats it as Horovod's elastic mode does: restore the last commit, retry.
HorovodInternalError = CollectiveError


class RunTimeoutError(WorkerFailedError, TimeoutError):
    """Ranks did not finish in time (``timeout`` of :func:`hora.runners.run`, or
    ``HORA_FINISH_TIMEOUT`` after another rank had already returned)."""


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
    "RunTimeoutError",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "HorovodVersionMismatchError",
    "get_version_mismatch_message",
]
