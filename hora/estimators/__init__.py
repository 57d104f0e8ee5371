"""Estimators: one engine-neutral fit pipeline, one small module per framework, and faces built from them.

* :mod:`hora.estimators.params`    - :class:`EstimatorConfig`: each parameter declared once
* :mod:`hora.estimators.framework` - the seam: :class:`ModelCodec` (driver), :class:`TrainingSession`
  (worker), the :class:`Framework` descriptor bundling them with the framework's config
* :mod:`hora.estimators.torch`, :mod:`hora.estimators.keras`, :mod:`hora.estimators.lightning` -
  the frameworks
* :mod:`hora.estimators.core`      - validate -> materialize -> run workers -> collect (``fit``)
* :mod:`hora.estimators.spec`      - the frozen :class:`TrainSpec` every worker gets
* :mod:`hora.estimators.worker`    - ``train_worker(spec)``, the per-rank training loop
* :mod:`hora.estimators.data`      - feature inputs and groups, samples, Dask frames
* :mod:`hora.estimators.callbacks` - epoch/batch hooks, EarlyStopping, BestModelCheckpoint, MLflowLogger
* :mod:`hora.estimators.transform` - batched inference over Spark, Dask and pandas frames
* :mod:`hora.estimators.persistence` - saving models and estimators to any Store URL
* faces: :mod:`hora.estimators.spark_face` (``hora.spark``) and :mod:`hora.estimators.dask_face`
  (``hora.dask``), each built from a framework descriptor

Nothing here imports pyspark, dask or a deep-learning framework at import time.
"""

from hora.estimators.callbacks import BestModelCheckpoint, Callback, CallbackContext, EarlyStopping, MLflowLogger
from hora.estimators.framework import Framework, ModelCodec, TrainingSession, get_framework
from hora.estimators.params import PARAM_DEFAULTS, PARAM_DOCS, EstimatorConfig

__all__ = [
    "EstimatorConfig",
    "PARAM_DEFAULTS",
    "PARAM_DOCS",
    "Framework",
    "ModelCodec",
    "TrainingSession",
    "get_framework",
    "Callback",
    "CallbackContext",
    "EarlyStopping",
    "BestModelCheckpoint",
    "MLflowLogger",
]
