"""Horovod's ``horovod.spark.common`` paths: :mod:`.store` (``Store``) and :mod:`.backend` (``SparkBackend``)."""
