"""``hora.spark.task.task_service``: Horovod's Spark task service, an internal hora does not have.

Each rank of ``hora.spark.run`` is a Spark barrier task that joins hora's rendezvous
(:mod:`hora.runners.launchers.spark`); importing Horovod's names works, using them raises
(:mod:`hora.horovod_internals`).
"""

from hora.horovod_internals import module_getattr

_INSTEAD = ("each rank of hora.spark.run is a Spark barrier task that joins hora's signed rendezvous "
            "(hora.runners.launchers.spark)")

__getattr__ = module_getattr(__name__, {"SparkTaskService": _INSTEAD, "SparkTaskClient": _INSTEAD})
