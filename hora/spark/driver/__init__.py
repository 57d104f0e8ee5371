"""``hora.spark.driver``: Horovod's path to the driver service of ``horovod.spark.run`` (see :mod:`.driver_service`)."""
