"""``hora.spark.run``: Horovod's ``horovod.spark.run``, same signature.

>>> import hora.spark
>>> def train():
...     import hora.torch as hvd
...     hvd.init()
...     return hvd.rank()
>>> hora.spark.run(train, num_proc=2)        # on the active SparkSession: [0, 1]

Runs ``num_proc`` ranks as the tasks of one Spark barrier stage
(:class:`hora.runners.launchers.spark.SparkLauncher`) and returns ``fn``'s values in rank order.
As in Horovod, ``fn`` calls ``hvd.init()`` itself. The ranks talk over Gloo (shared
memory between ranks on one executor host); MPI inside Spark tasks is not supported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any

from hora.errors import ConfigError


def run(
    fn: Callable[..., Any],
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    num_proc: int | None = None,
    start_timeout: float | None = None,
    use_mpi: bool | None = None,
    use_gloo: bool | None = None,
    extra_mpi_args: str | None = None,
    env: Mapping[str, str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    verbose: int = 1,
    nics: Iterable[str] | None = None,
    prefix_output_with_timestamp: bool = False,
    executable: str | None = None,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``num_proc`` Spark tasks; return their values in rank order.

    Args (Horovod's):
        fn: a picklable function; it calls ``hvd.init()`` itself.
        args, kwargs: its arguments.
        num_proc: ranks (default ``spark.default.parallelism``); all must fit in the
            cluster's free task slots at once (one barrier stage).
        start_timeout: seconds for every task to start (default ``HORA_START_TIMEOUT`` or 60).
        use_mpi, extra_mpi_args: not supported on Spark (a ConfigError says so).
        use_gloo: accepted: Gloo is what Spark ranks use.
        env: extra environment variables for every rank.
        stdout, stderr: where the ranks' output is printed (default the driver's).
        verbose: 0 quiet, 1 rank output and progress, 2 debug logs in the ranks.
        nics: the network interface the ranks communicate on (the first one is used;
            each rank advertises that interface's address on its executor).
        prefix_output_with_timestamp: prefix every printed line with the time it arrived.
        executable: the Python the executors start the ranks with (default theirs).

    Raises:
        ConfigError: no active SparkSession, MPI asked for, more ranks than task slots.
        WorkerFailedError: a rank failed (rank, host, remote traceback).
    """
    from hora.runners import api as base
    from hora.runners.spec import ENV_NETWORK_INTERFACE, ENV_WORKER_PYTHON

    if use_mpi or extra_mpi_args:
        raise ConfigError("hora.spark.run: use_mpi / extra_mpi_args are not supported; hora runs Spark ranks over "
                          "Gloo (use hora.run(..., use_mpi=True) for MPI on hosts)")
    if env is not None and not isinstance(env, Mapping):
        raise ConfigError(f"hora.spark.run: env must be a mapping of str to str, got {type(env).__name__}")
    extra = dict(env or {})
    nic_list = [nics] if isinstance(nics, str) else list(nics or [])
    if nic_list:
        extra[ENV_NETWORK_INTERFACE] = str(nic_list[0])
    if executable:
        extra[ENV_WORKER_PYTHON] = str(executable)
    return base.run(fn, args=tuple(args), kwargs=dict(kwargs or {}), num_proc=num_proc, backend="spark",
                    env=extra, start_timeout=start_timeout, verbose=int(verbose), init_native=False,
                    stdout=stdout, stderr=stderr, timestamps=bool(prefix_output_with_timestamp))


def run_elastic(
    fn: Callable[..., Any],
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    num_proc: int | None = None,
    min_num_proc: int | None = None,
    max_num_proc: int | None = None,
    start_timeout: float | None = None,
    elastic_timeout: float | None = None,
    reset_limit: int | None = None,
    env: Mapping[str, str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    verbose: int = 1,
    nics: Iterable[str] | None = None,
    prefix_output_with_timestamp: bool = False,
    cooldown_range: tuple[float, float] | None = None,
) -> list[Any]:
    """Horovod's ``horovod.spark.run_elastic``: run ``fn`` on Spark tasks, relaunching after failures.

    ``fn`` calls ``hvd.init()`` and trains inside ``@hvd.elastic.run`` with an elastic state
    (``hvd.elastic.TorchState``), as in Horovod: a failed collective restores the last commit
    on every rank. A rank whose task fails (it raised, its executor was lost) ends the
    attempt; the ranks are started again, up to ``reset_limit`` times (default: Spark's
    ``spark.task.maxFailures`` for the session, ``local[n, f]``'s ``f``), with between
    ``min_num_proc`` and ``max_num_proc`` ranks (as many as there are task slots for).

    Args (Horovod's): as :func:`run`, and
        num_proc: the ranks to start with (default ``max_num_proc``, else Spark's default parallelism).
        min_num_proc, max_num_proc: the fewest and most ranks of an attempt.
        reset_limit: how many times the ranks may be started again.
        elastic_timeout: seconds to wait for ``min_num_proc`` task slots (default ``start_timeout``).
        cooldown_range: accepted; hora relaunches as soon as slots are free.

    Raises:
        ConfigError: no active SparkSession, bad counts.
        WorkerFailedError: the ranks failed more than ``reset_limit`` times (the last failure's rank,
            host and remote traceback).
    """
    from hora.runners import api as base
    from hora.runners.spec import ENV_NETWORK_INTERFACE

    if env is not None and not isinstance(env, Mapping):
        raise ConfigError(f"hora.spark.run_elastic: env must be a mapping of str to str, got {type(env).__name__}")
    most = max_num_proc or num_proc
    if min_num_proc is not None and most is not None and min_num_proc > most:
        raise ConfigError(f"hora.spark.run_elastic: min_num_proc={min_num_proc} is greater than "
                          f"max_num_proc={max_num_proc}")
    if reset_limit is None:
        reset_limit = _spark_task_failures()
    if isinstance(reset_limit, bool) or not isinstance(reset_limit, int) or reset_limit < 0:
        raise ConfigError(f"hora.spark.run_elastic: reset_limit must be an int >= 0, got {reset_limit!r}")
    extra = dict(env or {})
    nic_list = [nics] if isinstance(nics, str) else list(nics or [])
    if nic_list:
        extra[ENV_NETWORK_INTERFACE] = str(nic_list[0])
    return base.run(fn, args=tuple(args), kwargs=dict(kwargs or {}), num_proc=most, backend="spark", env=extra,
                    start_timeout=elastic_timeout or start_timeout, verbose=int(verbose), init_native=False,
                    stdout=stdout, stderr=stderr, timestamps=bool(prefix_output_with_timestamp),
                    max_failures=reset_limit, min_num_proc=min_num_proc)


def _spark_task_failures() -> int:
    """Relaunches the active session allows: ``f - 1`` for ``local[n, f]`` or ``spark.task.maxFailures = f``
    (Spark's count includes the first attempt), at least 1.

    Raises:
        ConfigError: no active SparkSession.
    """
    from hora import _spark

    session = _spark.active_session()
    master = _spark.master(session)
    if master.startswith("local[") and "," in master:
        tries = master[len("local["):-1].split(",")[1].strip()
    else:
        tries = _spark.conf_get(session, "spark.task.maxFailures", "4") or "4"
    try:
        return max(1, int(tries) - 1)
    except ValueError:
        return 1


__all__ = ["run", "run_elastic"]
