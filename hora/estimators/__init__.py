"""Estimators: one engine-neutral fit pipeline, one small module per framework, and faces built from them.

* :mod:`hora.estimators.params`    - :class:`EstimatorConfig`: each parameter declared once
* :mod:`hora.estimators.framework` - the seam: :class:`ModelCodec` (driver), :class:`TrainingSession`
  (worker), the :class:`Framework` descriptor bundling them with the framework's config
* :mod:`hora.estimators.frameworks.torch.codec`, :mod:`hora.estimators.frameworks.keras.codec`, :mod:`hora.estimators.frameworks.lightning` -
  the frameworks
* :mod:`hora.estimators.driver.fit`      - validate -> materialize -> run workers -> collect (``fit``)
* :mod:`hora.estimators.spec`      - the frozen :class:`TrainSpec` every worker gets
* :mod:`hora.estimators.worker.loop`    - ``train_worker(spec)``, the per-rank training loop
* :mod:`hora.estimators.data.frames`      - feature inputs and groups, samples, Dask frames
* :mod:`hora.estimators.callbacks` - epoch/batch hooks, EarlyStopping, BestModelCheckpoint, MLflowLogger
* :mod:`hora.estimators.driver.transform` - batched inference over Spark, Dask and pandas frames
* :mod:`hora.estimators.driver.persistence` - saving models and estimators to any Store URL
* faces: :mod:`hora.estimators.faces.spark` (``hora.spark``) and :mod:`hora.estimators.faces.sklearn`
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
