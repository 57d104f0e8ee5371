"""What a failed Spark stage means: the one place hora reads Spark's error text.

:func:`stage_error` turns the exception of a failed barrier stage into hora's error: a
:class:`~hora.errors.ConfigError` for what the cluster cannot do (too few slots, dynamic
allocation, resource profiles), a missing hora on the executors, a StoreError, or the typed
failure of :func:`stage_failure`: a :class:`~hora.errors.WorkerLostError` naming the rank of
a lost executor (:func:`engine_failure`), else a :class:`~hora.errors.TaskFailedError`.
"""

from __future__ import annotations

import re
from typing import Any

from hora import _spark
from hora.errors import ConfigError, FaultKind, StoreError, WorkerFailedError, failure_class
from hora.runners.driver.faults import with_spark_error
from hora.runners.spec import LaunchSpec


def stage_error(exc: BaseException, spec: LaunchSpec, launcher: Any) -> Exception:
    """The error ``run()`` raises for a failed stage: ConfigError for what the cluster cannot do,
    else WorkerFailedError with the first meaningful line of Spark's message; Spark's own
    error (with its Java stack) is kept as the result's ``spark_error``. ``launcher``: the
    :class:`~hora.runners.launchers.spark.SparkLauncher` (its master and task description)."""
    return with_spark_error(_stage_error_of(exc, spec, launcher), exc)


def _stage_error_of(exc: BaseException, spec: LaunchSpec, launcher: Any) -> Exception:
    text = str(exc)
    if "SPARK-24819" in text:
        return ConfigError(
            f"num_proc={spec.num_proc} needs {spec.num_proc} task slots at once (one barrier stage) "
            f"{launcher.describe_task()}, but the Spark cluster ({launcher.master}) has fewer; lower num_proc "
            f"or add executors/cores (Spark: {_first_line(text, 'SPARK-24819')})"
        )
    if "SPARK-24942" in text:
        return ConfigError(
            "the Spark cluster runs with dynamic allocation, and Spark cannot run barrier stages then: set "
            f"spark.dynamicAllocation.enabled=false for training (Spark: {_first_line(text, 'SPARK-24942')})"
        )
    if "No executor resource configs were specified" in text:
        return ConfigError(
            f"use_gpu=True asks for one GPU per training task, but the executors of this Spark cluster "
            f"({launcher.master}) declare no GPUs (spark.executor.resource.gpu.amount and a discovery script): "
            f"Spark: {_first_line(text, 'No executor resource configs')}"
        )
    if "ResourceProfiles are only supported" in text:
        return ConfigError(
            f"this Spark cluster ({launcher.master}) cannot schedule the training stage's ResourceProfile "
            f"({launcher.describe_task()}): Spark: {_first_line(text, 'ResourceProfiles are only supported')}"
        )
    missing = _spark.missing_hora(exc)
    if missing is not None:
        return missing
    store_error = re.search(r"hora\.errors\.StoreError: ([^\n]*)", text)
    if store_error:
        return StoreError(f"the Spark barrier stage of run {spec.run_id} could not use the store: {store_error.group(1)}")
    match = _RANK_FAILURE.search(text)
    short = match.group(1) if match else " / ".join([ln for ln in text.splitlines() if ln.strip()][:3])[:1000]
    return stage_failure(f"the Spark barrier stage of run {spec.run_id} failed: {short}")


#: a rank's failure as the task's Python traceback shows it: WorkerFailedError or the subclass of its kind
_RANK_FAILURE = re.compile(r"(hora\.errors\.(?:%s): [^\n]*)" % "|".join(
    sorted({WorkerFailedError.__name__, *(failure_class(kind).__name__ for kind in FaultKind)})))


# "Python worker exited unexpectedly (crashed)": the task's Python process died (killed by the OOM
# killer or an operator); hora's own code runs there only to supervise the rank, which is a process
# of its own, so a crash of the user's code shows as the rank's exit, not as this
_SPARK_LOST = re.compile(r"ExecutorLostFailure|executor \S+ (?:lost|exited)|Executor heartbeat timed out|"
                         r"Slave lost|worker lost|Container killed|Container from a bad node|"
                         r"decommission|Python worker exited unexpectedly", re.IGNORECASE)
_SPARK_TASK = re.compile(r"barrier task ResultTask\(\d+, (\d+)\)")
_SPARK_EXECUTOR_LOST = re.compile(r"(ExecutorLostFailure \([^)]*\))(?: Reason: ([^/\n]*))?")
_SPARK_WORKER_CRASHED = re.compile(r"Python worker exited unexpectedly \(crashed\)")


def kind_of_engine_error(text: str) -> FaultKind:
    """The kind of a Spark stage failure without a rank's own report (Spark's error text):
    ``LOST`` when Spark says an executor was lost, else ``TASK``."""
    return FaultKind.LOST if _SPARK_LOST.search(text or "") else FaultKind.TASK


def engine_failure(text: str) -> tuple[FaultKind, int | None, str | None]:
    """``(kind, rank, message)`` of a Spark stage failure from its text, the one place hora reads
    Spark's error text for what happened: the rank of the task Spark names as the one that failed
    (a barrier task's partition is its rank) and, for a lost executor,
    ``"was lost: ExecutorLostFailure (...): <reason>"``, for a task whose Python worker (the
    rank's supervisor) died, ``"was lost: its Spark task's Python worker exited unexpectedly
    (crashed)"`` (else None)."""
    kind = kind_of_engine_error(text)
    task = _SPARK_TASK.search(text or "")
    rank = int(task.group(1)) if task else None
    lost = _SPARK_EXECUTOR_LOST.search(text or "")
    message = None
    if lost:
        reason = (lost.group(2) or "").strip()
        message = f"was lost: {lost.group(1)}" + (f": {reason}" if reason else "")
    elif _SPARK_WORKER_CRASHED.search(text or ""):
        message = "was lost: its Spark task's Python worker exited unexpectedly (crashed)"
    return kind, rank, message


def executor_lost(text: str) -> bool:
    """Whether a Spark stage failure's text says a whole executor was lost (every task on its host
    went with it), not only one task's Python worker."""
    return bool(_SPARK_EXECUTOR_LOST.search(text or ""))


def stage_failure(summary: str) -> WorkerFailedError:
    """The typed error of a failed stage whose ranks did not say why (:func:`engine_failure`):
    a :class:`~hora.errors.WorkerLostError` naming the lost executor's rank, else a
    :class:`~hora.errors.TaskFailedError` (or a ``WorkerLostError``) with ``summary``."""
    kind, rank, message = engine_failure(summary)
    if rank is not None and message is not None:
        return failure_class(kind)(message, rank=rank)
    return failure_class(kind)(summary)


def _first_line(text: str, marker: str) -> str:
    for line in text.splitlines():
        if marker in line:
            return line.strip()[:500]
    return text.strip().splitlines()[0][:500] if text.strip() else ""


__all__ = ["stage_error", "stage_failure", "engine_failure", "executor_lost", "kind_of_engine_error"]
