"""hora on Ray: Horovod's ``horovod.ray`` API (``from hora.ray import RayExecutor``).

``RayExecutor`` keeps a group of workers (Ray actors in one placement group) and runs
functions on all of them together; see :mod:`hora.ray.executor`. To run one function
on N Ray actors without keeping them, use ``hora.runners.run(fn, num_proc=N,
backend="ray")`` (or ``backend=hora.runners.RayLauncher(cpus_per_rank=..., ...)``).
:mod:`hora.runners.launchers.ray` holds the Ray side of that launcher (placement
groups, rank actors). Needs the ``hora[ray]`` extra.
"""

from typing import Any

_EXECUTOR = ("RayExecutor", "RaySettings", "ElasticRayExecutor")


def __getattr__(name: str) -> Any:
    # lazy: `import hora.ray` must not import ray itself (the executor does)
    if name in _EXECUTOR:
        from hora.ray import executor

        return getattr(executor, name)
    raise AttributeError(f"module 'hora.ray' has no attribute {name!r}")


__all__ = list(_EXECUTOR)
