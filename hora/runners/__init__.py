"""Start N training ranks anywhere and collect their results or the first failure.

>>> import hora.runners
>>> hora.runners.run(fn, args=(...,), num_proc=2, backend="local")   # or "spark", "dask"

Inside ``fn``, ``hora.native`` is initialised and :func:`report` sends live metrics to
the driver's progress bar. See :func:`run`.
"""

from hora.runners.base import Backend, Job, RunTimeoutError, resolve_backend, run
from hora.runners.spec import LaunchSpec, RankContext


def __getattr__(name: str):
    # imported lazily: `python -m hora.runners.worker` must not find the worker module
    # already imported, and the engine backends import pyspark / distributed only when asked
    if name == "report":
        from hora.runners.worker import report

        return report
    if name == "LocalBackend":
        from hora.runners.local import LocalBackend

        return LocalBackend
    if name == "SparkBackend":
        from hora.runners.spark import SparkBackend

        return SparkBackend
    if name == "DaskBackend":
        from hora.runners.dask import DaskBackend

        return DaskBackend
    raise AttributeError(f"module 'hora.runners' has no attribute {name!r}")


__all__ = [
    "run",
    "report",
    "Backend",
    "Job",
    "LaunchSpec",
    "RankContext",
    "RunTimeoutError",
    "resolve_backend",
    "LocalBackend",
    "SparkBackend",
    "DaskBackend",
]
