"""hora on Ray: Horovod's ``horovod.ray`` API (``from hora.ray import RayExecutor``).

``RayExecutor`` keeps a group of workers (Ray actors in one placement group) and runs
functions on all of them together; see :mod:`hora.ray.executor`. To run one function
on N Ray actors without keeping them, use ``hora.runners.run(fn, num_proc=N,
backend="ray")`` (or ``backend=hora.runners.RayLauncher(cpus_per_rank=..., ...)``).
Needs the ``hora[ray]`` extra.
"""

from hora.ray.executor import ElasticRayExecutor, RayExecutor, RaySettings

__all__ = ["RayExecutor", "RaySettings", "ElasticRayExecutor"]
