"""``hora.spark.task``: Horovod's path to the task service of ``horovod.spark.run`` (see :mod:`.task_service`)."""
