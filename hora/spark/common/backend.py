"""``hora.spark.common.backend``: Horovod's ``Backend`` interface and its ``SparkBackend``.

An estimator given ``backend=SparkBackend(num_proc=4, ...)`` trains its ranks as one
Spark barrier stage, as without it; the backend's settings become the launch's. A
custom :class:`Backend` (Horovod's interface: ``run(fn, args, kwargs, env)`` and
``num_processes()``) runs the training function wherever it likes.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable, Mapping, Sequence

from hora.errors import ConfigError

logger = logging.getLogger(__name__)


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

    Args:
        num_proc: ranks (default: the Spark default parallelism, read when training starts).
        env: environment variables for the ranks (added to the executors' environment).
        stdout, stderr: where Horovod sent rank output; hora prints it on the driver's
            ``sys.stdout`` / ``sys.stderr`` prefixed by rank (and keeps it in the run's logs):
            other streams are not written to (logged once).
        prefix_output_with_timestamp: hora prefixes lines by rank, not time (logged once).
        start_timeout: seconds for every rank to start.
        verbose: the launcher's verbosity (default: the estimator's ``verbose``).
        use_gloo: collectives over Gloo (hora's default on Spark).
        nics: network interfaces for the collectives (``GLOO_SOCKET_IFNAME``).

    Raises:
        ConfigError: Horovod's MPI options (``use_mpi``, ``extra_mpi_args``) or
            ``executable``, which hora's Spark launcher does not have (the message says
            what to do instead), and unknown keywords.
    """

    def __init__(self, num_proc: int | None = None, env: Mapping[str, str] | None = None, stdout: Any = None,
                 stderr: Any = None, prefix_output_with_timestamp: bool = False, start_timeout: float | None = None,
                 verbose: int | None = None, use_mpi: bool | None = None, use_gloo: bool | None = None,
                 nics: Sequence[str] | None = None, extra_mpi_args: str | None = None, executable: str | None = None,
                 **kwargs: Any) -> None:
        if kwargs:
            raise ConfigError(f"SparkBackend got unknown keyword(s) {sorted(kwargs)}; it takes num_proc, env, stdout, "
                              "stderr, prefix_output_with_timestamp, start_timeout, verbose, use_gloo, nics")
        if use_mpi or extra_mpi_args:
            raise ConfigError("SparkBackend(use_mpi=/extra_mpi_args=): hora's Spark launcher runs the collectives over "
                              "Gloo (NCCL on GPUs), not mpirun; drop them (MPI is for `hora run --mpi`)")
        if executable is not None:
            raise ConfigError("SparkBackend(executable=): hora starts each rank with the executors' Python; set "
                              "PYSPARK_PYTHON (or spark.pyspark.python) to choose it")
        if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1):
            raise ConfigError(f"SparkBackend num_proc must be an int >= 1, got {num_proc!r}")
        for name, stream, default in (("stdout", stdout, sys.stdout), ("stderr", stderr, sys.stderr)):
            if stream is not None and stream is not default and stream is not getattr(sys, f"__{name}__"):
                logger.warning("SparkBackend(%s=%r): hora prints rank output on the driver's sys.%s (prefixed by rank) "
                               "and saves it in the run's logs in the store; the given stream is not written to",
                               name, stream, name)
        if prefix_output_with_timestamp:
            logger.warning("SparkBackend(prefix_output_with_timestamp=True): hora prefixes rank output with "
                           "[rank]<stream>, without timestamps")
        self._num_proc = num_proc
        self._env = {str(k): str(v) for k, v in (env or {}).items()}
        if nics:
            self._env["GLOO_SOCKET_IFNAME"] = ",".join(nics)
        if use_gloo:
            self._env["HORA_BACKEND"] = "gloo"
        self._start_timeout = start_timeout
        self._verbose = verbose

    def num_processes(self) -> int:
        """The number of ranks (Spark's default parallelism when ``num_proc`` was not given)."""
        if self._num_proc is not None:
            return self._num_proc
        from hora.runners import resolve_backend

        return resolve_backend("spark").default_num_proc()

    def launch_options(self) -> dict[str, Any]:
        """``hora.runners.run`` keywords for an estimator's launch (None: the estimator's own)."""
        return {"backend": "spark", "num_proc": self._num_proc, "env": dict(self._env),
                "start_timeout": self._start_timeout, "verbose": self._verbose}

    def run(self, fn: Callable[..., Any], args: tuple = (), kwargs: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on the ranks (Horovod's ``Backend.run``); the results in rank order."""
        from hora import runners

        merged = {**self._env, **{str(k): str(v) for k, v in (env or {}).items()}}
        opts = {k: v for k, v in (("start_timeout", self._start_timeout), ("verbose", self._verbose)) if v is not None}
        return runners.run(fn, args=tuple(args), kwargs=dict(kwargs or {}), num_proc=self.num_processes(),
                           backend="spark", env=merged, **opts)

    def __repr__(self) -> str:
        return f"SparkBackend(num_proc={self._num_proc!r})"


__all__ = ["Backend", "SparkBackend"]
