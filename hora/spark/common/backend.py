"""``hora.spark.common.backend``: Horovod's ``Backend`` interface and its ``SparkBackend``.

An estimator given ``backend=SparkBackend(num_proc=4, ...)`` trains its ranks as one
Spark barrier stage, as without it; the backend's settings (ranks, environment, output
streams, timestamps, interface, executor Python) become the launch's. A custom
:class:`Backend` (Horovod's interface: ``run(fn, args, kwargs, env)`` and
``num_processes()``) runs the training function wherever it likes.
"""

from __future__ import annotations

from typing import IO, Any, Callable, Mapping, Sequence

from hora.errors import ConfigError


class Backend:
    """Horovod's interface for running the distributed training function elsewhere."""

    def run(self, fn: Callable[..., Any], args: tuple = (), kwargs: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None) -> list[Any]:
        """Run ``fn`` on every rank; the results in rank order."""
        raise NotImplementedError(f"{type(self).__name__}.run")

    def num_processes(self) -> int:
        """The number of ranks."""
        raise NotImplementedError(f"{type(self).__name__}.num_processes")


class SparkBackend(Backend):
    """Run the ranks as the tasks of one Spark barrier stage (Horovod's ``SparkBackend``).

    Args (Horovod's, as :func:`hora.spark.run` takes them):
        num_proc: ranks (default: the Spark default parallelism, read when training starts).
        env: environment variables for the ranks.
        stdout, stderr: where the ranks' output is printed (default the driver's).
        prefix_output_with_timestamp: prefix each printed line with the time it arrived.
        start_timeout: seconds for every rank to start.
        verbose: the launcher's verbosity (default: the estimator's ``verbose``).
        use_gloo: accepted: Gloo is what Spark ranks use.
        nics: the network interface the ranks communicate on (the first one).
        executable: the Python the executors start the ranks with.

    Raises:
        ConfigError: ``use_mpi`` / ``extra_mpi_args`` (MPI inside Spark tasks is not
            supported), a bad ``num_proc``, unknown keywords.
    """

    def __init__(self, num_proc: int | None = None, env: Mapping[str, str] | None = None,
                 stdout: IO[str] | None = None, stderr: IO[str] | None = None,
                 prefix_output_with_timestamp: bool = False, start_timeout: float | None = None,
                 verbose: int | None = None, use_mpi: bool | None = None, use_gloo: bool | None = None,
                 nics: Sequence[str] | str | None = None, extra_mpi_args: str | None = None,
                 executable: str | None = None, **kwargs: Any) -> None:
        if kwargs:
            raise ConfigError(f"SparkBackend got unknown keyword(s) {sorted(kwargs)}; it takes num_proc, env, stdout, "
                              "stderr, prefix_output_with_timestamp, start_timeout, verbose, use_gloo, nics, executable")
        if use_mpi or extra_mpi_args:
            raise ConfigError("SparkBackend(use_mpi=/extra_mpi_args=): hora runs Spark ranks over Gloo (NCCL on GPUs), "
                              "MPI inside Spark tasks is not supported; drop them (MPI is for `hora run --mpi`)")
        if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1):
            raise ConfigError(f"SparkBackend num_proc must be an int >= 1, got {num_proc!r}")
        if env is not None and not isinstance(env, Mapping):
            raise ConfigError(f"SparkBackend env must be a mapping of str to str, got {type(env).__name__}")
        self._num_proc = num_proc
        self._env = {str(k): str(v) for k, v in (env or {}).items()}
        self._stdout, self._stderr = stdout, stderr
        self._timestamps = bool(prefix_output_with_timestamp)
        self._start_timeout = start_timeout
        self._verbose = verbose
        self._nics = [nics] if isinstance(nics, str) else list(nics or [])
        self._executable = executable

    def num_processes(self) -> int:
        """The number of ranks (Spark's default parallelism when ``num_proc`` was not given)."""
        if self._num_proc is not None:
            return self._num_proc
        from hora.runners import resolve_launcher

        return resolve_launcher("spark").default_num_proc()

    def _rank_env(self) -> dict[str, str]:
        from hora.runners.spec import ENV_NETWORK_INTERFACE, ENV_WORKER_PYTHON

        env = dict(self._env)
        if self._nics:
            env[ENV_NETWORK_INTERFACE] = str(self._nics[0])
        if self._executable:
            env[ENV_WORKER_PYTHON] = str(self._executable)
        return env

    def launch_options(self) -> dict[str, Any]:
        """``hora.runners.run`` keywords for an estimator's launch (None: the estimator's own)."""
        return {"backend": "spark", "num_proc": self._num_proc, "env": self._rank_env(),
                "start_timeout": self._start_timeout, "verbose": self._verbose, "stdout": self._stdout,
                "stderr": self._stderr, "timestamps": self._timestamps or None}

    def run(self, fn: Callable[..., Any], args: tuple = (), kwargs: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on the ranks with :func:`hora.spark.run` (Horovod's ``Backend.run``)."""
        from hora.spark.runner import run

        merged = {**self._env, **{str(k): str(v) for k, v in (env or {}).items()}}
        return run(fn, args=tuple(args), kwargs=dict(kwargs or {}), num_proc=self.num_processes(),
                   start_timeout=self._start_timeout, env=merged, stdout=self._stdout, stderr=self._stderr,
                   verbose=1 if self._verbose is None else self._verbose, nics=self._nics or None,
                   prefix_output_with_timestamp=self._timestamps, executable=self._executable)

    def __repr__(self) -> str:
        return f"SparkBackend(num_proc={self._num_proc!r})"


__all__ = ["Backend", "SparkBackend"]
