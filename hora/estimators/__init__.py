"""Estimators: one engine-neutral fit pipeline, framework hooks, and the Spark and Dask faces.

* :mod:`hora.estimators.params`   - :class:`EstimatorConfig`, the validated parameters of both faces
* :mod:`hora.estimators.core`     - validate -> materialize -> run workers -> collect (``fit``)
* :mod:`hora.estimators.spec`     - the frozen :class:`TrainSpec` every worker gets
* :mod:`hora.estimators.worker`   - ``train_worker(spec)``, the per-rank training loop
* :mod:`hora.estimators.trainer`  - the :class:`Trainer` hooks protocol (what a framework provides)
* :mod:`hora.estimators.torch_trainer` - the PyTorch hooks
* :mod:`hora.estimators.callbacks` - epoch/batch hooks, EarlyStopping, BestModelCheckpoint
* :mod:`hora.estimators.transform` - batched inference over Spark, Dask and pandas frames
* :mod:`hora.estimators.persistence` - saving models and estimators to any Store URL
* faces: :mod:`hora.estimators.spark_estimator` (re-exported by :mod:`hora.spark`) and
  :mod:`hora.estimators.dask_estimator` (re-exported by :mod:`hora.dask`)

Nothing here imports pyspark, dask or a deep-learning framework at import time.
"""

from hora.estimators.callbacks import BestModelCheckpoint, Callback, CallbackContext, EarlyStopping
from hora.estimators.params import PARAM_DEFAULTS, PARAM_DOCS, EstimatorConfig
from hora.estimators.trainer import Trainer

__all__ = [
    "EstimatorConfig",
    "PARAM_DEFAULTS",
    "PARAM_DOCS",
    "Trainer",
    "Callback",
    "CallbackContext",
    "EarlyStopping",
    "BestModelCheckpoint",
]
