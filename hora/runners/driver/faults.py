"""What kind of fault a failure is: a lost rank (relaunch) or an error in the user's code (fail at once).

Every failure the monitor sees gets a :class:`~hora.errors.FaultKind`, and the run raises the
subclass of :class:`~hora.errors.WorkerFailedError` of its root cause's kind (in
:mod:`hora.errors`; ``retriable`` and ``symptom`` are class attributes):
``RankKilledError`` (SIGNAL), ``WorkerLostError`` (LOST), ``RanksNotStartedError`` (START,
also a ``RendezvousError``), ``InfrastructureError``, ``RankError`` (ERROR), ``RankExitError``
(EXIT), ``CollectiveFailedError`` (COLLECTIVE), ``TaskFailedError`` (TASK), ``RunTimeoutError``
(TIMEOUT). What Spark's error text says (a lost executor) is read at the Spark boundary
(:func:`hora.runners.launchers.spark_errors.engine_failure`). The kinds answer two questions:

* **Is it a symptom?** A survivor's error when a peer vanished (a ``CollectiveError`` /
  ``HorovodInternalError`` "rank 1 is unreachable", a ``RendezvousError`` waiting for a
  peer that never comes, a reset connection) or an engine task that failed only because
  its rank did. The monitor prefers any failure that is not a symptom as the *root cause*
  (:func:`hora.runners.driver.monitor.first_failure`), so a SIGKILL of rank 1 is reported as
  rank 1's, not as rank 0's CollectiveError.
* **Is it retriable?** With ``max_failures`` (:mod:`hora.runners.driver.recovery`) a run whose
  root cause is retriable is relaunched; any other root cause fails the run at once.

Retriable (infrastructure: the same code would have run on a healthy cluster):

======================  =================================================================
``SIGNAL``              a rank process was killed by a signal hora did not send (SIGKILL of
                        the OOM killer or an operator, SIGTERM of a preempting scheduler,
                        SIGSEGV/SIGBUS of a faulty node)
``LOST``                a host, Spark executor or Dask worker was lost: its ssh session
                        ended, its heartbeats stopped, Spark reports the executor lost (or
                        the task's Python worker crashed), the Dask worker died or left, or
                        its task was lost
``START``               ranks never started, or never met at the engine's start barrier,
                        within ``start_timeout`` (a lost or overloaded node)
``INFRASTRUCTURE``      a rank raised ``RendezvousError``, ``ConnectionError`` (reset,
                        refused, broken pipe) or ``torch.distributed.DistNetworkError`` /
                        ``DistStoreError`` and no other cause was seen
======================  =================================================================

Not retriable (a user error: the run fails at once, as without ``max_failures``):

======================  =================================================================
``ERROR``               a rank raised any other exception (a bug, a bad loss, a DataError)
``EXIT``                a rank process exited with a non-zero code without a retriable
                        exception (``sys.exit(3)``, ``os._exit(1)``, a command that failed)
``COLLECTIVE``          a ``CollectiveError`` with no lost rank behind it (ranks disagree
                        about a shape, dtype, op or process set); when a rank *was* lost the
                        lost rank is the root cause and the run is relaunched
``TASK``                a Spark/Dask task failed for a reason hora cannot attribute to a
                        lost executor or worker
``TIMEOUT``             the run's ``timeout``, or ranks that hung after others returned
======================  =================================================================
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence
from typing import TypeVar

from hora.errors import FaultKind, RendezvousError, WorkerFailedError, failure_class
from hora.runners.rank.procs import describe_exit
from hora.runners.spec import FailureReport

E = TypeVar("E", bound=BaseException)


#: exception classes (qualified names) a survivor raises when a peer is lost
COLLECTIVE_ERRORS = frozenset({
    "hora.errors.CollectiveError",  # = HorovodInternalError
    "torch.distributed.DistBackendError",
})
#: exception classes (qualified names) of a broken connection or rendezvous
INFRASTRUCTURE_ERRORS = frozenset({
    "hora.errors.RendezvousError",
    "builtins.ConnectionError",
    "torch.distributed.DistNetworkError",
    "torch.distributed.DistStoreError",
})
_BUILTIN_CONNECTION = frozenset({"ConnectionError", "ConnectionResetError", "ConnectionRefusedError",
                                 "ConnectionAbortedError", "BrokenPipeError"})


#: Gloo's transport failures (a closed, reset or silent connection to a peer), which torch's own
#: collectives (DDP, FSDP, torch.distributed on hora's default group) raise as a plain
#: ``RuntimeError``: "[.../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:21910:
#: Connection reset by peer"; the text is Gloo's only mark of them
GLOO_TRANSPORT_ERROR = re.compile(r"gloo/transport/[\w/]+\.cc:\d+\]")


def kind_of_exception(types: Sequence[str], error: str = "") -> FaultKind:
    """The kind of an exception a rank raised, from its classes' qualified names (its MRO) and,
    for a ``RuntimeError``, its ``"TypeName: message"`` (a Gloo transport failure is a
    collective's: a symptom of a lost peer, see :data:`GLOO_TRANSPORT_ERROR`)."""
    names = set(types)
    if names & COLLECTIVE_ERRORS:
        return FaultKind.COLLECTIVE
    if "builtins.RuntimeError" in names and GLOO_TRANSPORT_ERROR.search(error):
        return FaultKind.COLLECTIVE
    if names & INFRASTRUCTURE_ERRORS:
        return FaultKind.INFRASTRUCTURE
    return FaultKind.ERROR


_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


def kind_of_exit(code: int, traceback: str | None = None) -> FaultKind:
    """The kind of a process exit with Popen's ``code`` (``-N`` for signal N).

    A non-zero exit code whose last Python traceback (a command's stderr) ends in a
    collective or connection error is that error's kind, so the survivors of a lost
    rank under ``hora run`` are symptoms too.
    """
    if code < 0:
        return FaultKind.SIGNAL
    lines = [ln.strip() for ln in (traceback or "").splitlines() if ln.strip()]
    if lines and lines[0].startswith("Traceback"):
        match = _EXC_LINE.match(lines[-1])
        if match:
            name = match.group(1)
            if name in _BUILTIN_CONNECTION:
                return FaultKind.INFRASTRUCTURE
            if name in ("CollectiveError", "HorovodInternalError", "RendezvousError"):
                name = "hora.errors." + ("RendezvousError" if name == "RendezvousError" else "CollectiveError")
            elif name == "RuntimeError":
                name = "builtins.RuntimeError"
            return kind_of_exception([name], lines[-1])
    return FaultKind.EXIT


def fault_kind(exc: BaseException) -> FaultKind:
    """The kind of an error a run raised: its class's ``kind`` (:class:`~hora.errors.RankKilledError`,
    ...); a bare ``RendezvousError`` is a start failure; anything else (an unclassified
    ``WorkerFailedError`` too) ``ERROR``."""
    kind = getattr(type(exc), "kind", None)
    if isinstance(kind, FaultKind):
        return kind
    if isinstance(exc, RendezvousError):
        return FaultKind.START
    return FaultKind.ERROR


def with_spark_error(error: E, spark_error: BaseException) -> E:
    """``error`` with the Spark failure it explains kept as ``error.spark_error``.

    hora raises such errors ``from None``: the Java stack and Spark's chained Python
    tracebacks (often 100+ lines) do not print in front of the explanation, and whoever
    wants them reads ``spark_error`` (also logged at DEBUG level).
    """
    error.spark_error = spark_error  # type: ignore[attr-defined]
    logging.getLogger(__name__).debug("the Spark error behind %s: %s", type(error).__name__, spark_error)
    return error


@dataclasses.dataclass(frozen=True)
class Failure:
    """One failed rank (or host), as a launcher or the driver service saw it.

    Attributes:
        seq: its number from the driver service's failure counter (lower = earlier).
        rank: the rank (for a host: its first rank; None when unknown).
        host: the host it ran on.
        message: one line: ``"failed with exit code 3"``, ``"raised ValueError: ..."``, ssh's error.
        traceback: the rank's traceback (or its last stderr lines), if any.
        exitcode: the process exit code (Popen's: ``-N`` for signal N), if it was a process.
        kind: what kind of fault it is (:class:`~hora.runners.driver.faults.FaultKind`): a symptom
            of another rank's loss or not, retriable or not.
        source: who saw it: ``"rank"`` (the rank's own report: the most exact account of
            that rank), ``"launcher"`` (an exit, a lost host) or ``"engine"`` (a Spark/Dask task).
    """

    seq: int
    rank: int | None
    host: str | None
    message: str
    traceback: str | None = None
    exitcode: int | None = None
    kind: FaultKind = FaultKind.ERROR
    source: str = "launcher"

    @classmethod
    def from_report(cls, report: FailureReport) -> Failure:
        if report.died:  # a task supervisor's account of a rank process that died without a word
            code = report.exitcode if report.exitcode is not None else 1
            return cls(seq=report.seq, rank=report.rank, host=report.host, message=f"failed with {describe_exit(code)}",
                       traceback=report.traceback or None, exitcode=report.exitcode,
                       kind=kind_of_exit(code), source="rank")
        kind = (kind_of_exception(report.error_types, report.error) if report.error_types
                else kind_of_exit(1, f"Traceback\n{report.error}"))  # a report without classes: by its name
        return cls(seq=report.seq, rank=report.rank, host=report.host, message=f"raised {report.error}",
                   traceback=report.traceback or None, exitcode=report.exitcode, kind=kind, source="rank")

    @classmethod
    def from_exit(cls, seq: int, rank: int, host: str, code: int, traceback: str | None) -> Failure:
        return cls(seq=seq, rank=rank, host=host, message=f"failed with {describe_exit(code)}",
                   traceback=traceback, exitcode=code, kind=kind_of_exit(code, traceback))

    @classmethod
    def lost(cls, seq: int, rank: int | None, host: str | None, message: str, exitcode: int | None = None) -> Failure:
        """A lost host, executor or worker (``message``: ``"was lost: ..."``)."""
        return cls(seq=seq, rank=rank, host=host, message=message, exitcode=exitcode, kind=FaultKind.LOST)

    def describe(self) -> str:
        """One line naming who failed and how: ``rank 1 on 127.0.0.1 failed with signal 9 (SIGKILL)``."""
        if self.rank is None and self.host is None:
            return self.message
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        where = f" on {self.host}" if self.host else ""
        return f"{who}{where} {self.message}"

    def error(self) -> WorkerFailedError:
        """The typed error of this failure (the subclass of its kind, :func:`hora.errors.failure_class`)."""
        return failure_class(self.kind)(self.describe(), rank=self.rank, host=self.host,
                                        remote_traceback=self.traceback, exitcode=self.exitcode)


__all__ = ["Failure", "FaultKind", "kind_of_exception", "kind_of_exit", "fault_kind", "with_spark_error",
           "COLLECTIVE_ERRORS", "INFRASTRUCTURE_ERRORS"]
