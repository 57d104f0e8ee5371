"""hora: distributed deep-learning training for data in Spark and Dask DataFrames.

Faces:
    hora.spark      TorchEstimator / KerasEstimator as pyspark.ml Estimators
    hora.dask       the same estimators with scikit-learn conventions on a Dask cluster
    hora.torch      Horovod-style API for torch scripts (``import hora.torch as hvd``)
    hora.tensorflow, hora.keras   the same for TensorFlow and Keras 3
    hora.runners    run a function on N ranks: local processes, ssh hosts, Spark or Dask
    hora.run        Horovod's ``horovod.run``: a function on N ranks, its values returned
    hora.store      the Store, DataFrame materialization and the per-rank reader

``HORA_LOG_LEVEL`` (TRACE, DEBUG, INFO, WARNING, ERROR, FATAL; ``hora run --log-level``)
sends hora's own log messages at that level and above to stderr.
"""

from __future__ import annotations

import logging
from typing import Any

__version__ = "0.1.0"

from hora.settings import ENV_LOG_LEVEL  # one constant per setting, in hora.settings
_LEVELS = {"TRACE": 5, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING,
           "WARN": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL, "CRITICAL": logging.CRITICAL}
_handler: logging.Handler | None = None


def configure_logging(level: str) -> None:
    """Send the ``hora`` loggers' messages at ``level`` and above to stderr (Horovod's log levels).

    Raises:
        ValueError: an unknown level (the known ones are named).
    """
    global _handler
    value = _LEVELS.get(str(level).strip().upper())
    if value is None:
        raise ValueError(f"log level {level!r} is unknown; use one of TRACE, DEBUG, INFO, WARNING, ERROR, FATAL")
    logging.addLevelName(5, "TRACE")
    logger = logging.getLogger("hora")
    logger.setLevel(value)
    if _handler is None:
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("[%(asctime)s %(levelname)s %(name)s] %(message)s"))
        logger.addHandler(_handler)
        logger.propagate = False  # the application's own handlers would print each message twice


def _level_from_environment() -> None:
    from hora import settings

    try:
        level = settings.get(ENV_LOG_LEVEL)
    except ValueError as exc:  # a ConfigError naming the variable, the value and the levels
        logging.getLogger("hora").warning("%s", exc)
        return
    if level:
        configure_logging(level)


_level_from_environment()


def __getattr__(name: str) -> Any:
    if name == "run":  # imported on first use: `import hora` stays light
        from hora.runners.api import horovod_run as run

        return run
    raise AttributeError(f"module 'hora' has no attribute {name!r}")
