"""Start N training ranks anywhere and collect their results or the first failure.

>>> import hora.runners
>>> hora.runners.run(fn, args=(...,), num_proc=2, backend="local")   # or "spark", "dask"
>>> hora.runners.run(fn, num_proc=4, backend=hora.runners.HostsLauncher("a:2,b:2"))  # ssh hosts
>>> launcher, options = hora.runners.resolve(SparkBackend(num_proc=4), spark=spark)  # any backend= shape
>>> hora.runners.run(fn, backend=launcher, **options.run_kwargs())

Inside ``fn``, ``hora.native`` is initialised and :func:`report` sends live metrics to
the driver's progress bar. See :func:`run`. A *launcher* (local processes, ssh hosts,
Spark, Dask) is where ranks run; the collective *backend* (Gloo, NCCL, MPI) is how they
talk, chosen in :mod:`hora.native.backends`.
"""

from hora.runners.api import RunTimeoutError, run
from hora.runners.launcher import BUILTIN, Job, Launcher, resolve_launcher
from hora.runners.resolution import LaunchOptions, resolve
from hora.runners.spec import LaunchSpec, RankContext

_LAZY = {
    **{cls: module for module, _, cls in (path.partition(":") for path in BUILTIN.values())},
    "BackendLauncher": "hora.runners.launchers.backend",
    "SshOptions": "hora.runners.rank.ssh",
    "HostSlots": "hora.runners.slots",
}


def __getattr__(name: str):
    # imported lazily: `python -m hora.runners.rank.main` must not find the worker module
    # already imported, and the engine launchers import pyspark / distributed only when asked
    if name == "report":
        from hora.runners.rank.main import report

        return report
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hora.runners' has no attribute {name!r}")


__all__ = [
    "run",
    "report",
    "Launcher",
    "Job",
    "LaunchSpec",
    "RankContext",
    "RunTimeoutError",
    "resolve_launcher",
    "resolve",
    "LaunchOptions",
    "BackendLauncher",
    "LocalLauncher",
    "HostsLauncher",
    "SparkLauncher",
    "DaskLauncher",
    "RayLauncher",
    "MpiLauncher",
    "SshOptions",
    "HostSlots",
]
