"""Estimators: one engine-neutral fit pipeline, one small package per framework, and faces built from them.

Rooms by concern, each a package with its own map (the layers are import-linter contracts: the faces
above the driver and the frameworks, above a rank's loop, above the seam, above the data):

* the seam, declared once, here at the top:

  * :mod:`hora.estimators.framework` - :class:`ModelCodec` (driver), :class:`TrainingSession` (a rank),
    the :class:`Framework` descriptor bundling them with the framework's config; ``get_framework(name)``
  * :mod:`hora.estimators.params` - :class:`EstimatorConfig`: each parameter declared once
    (:mod:`hora.estimators.param_info`: how a parameter is declared)
  * :mod:`hora.estimators.spec` - the frozen :class:`TrainSpec` every rank gets, ``freeze`` / ``thaw``
  * :mod:`hora.estimators.callbacks` - epoch/batch hooks, EarlyStopping, BestModelCheckpoint, MLflowLogger
    (:mod:`hora.estimators.mlflow_support`: its MLflow calls)
  * :mod:`hora.estimators.tasks` - classification: the task, a classifier's outputs and labels
  * :mod:`hora.estimators.devices` - a rank's CUDA device and CPU threads
  * :mod:`hora.estimators.old_names` - the modules' paths before these subpackages, for old pickles

* :mod:`hora.estimators.data` - the user's frame: engine, feature inputs, schema checks, samples
  (``frames``), column operations (``columns``), Ray Datasets (``ray_dataset``)
* :mod:`hora.estimators.driver` - ``fit`` (checks, materialize, launch, collect), ``transform``,
  ``persistence``, ``spark_python`` (a failed Spark fit explained)
* :mod:`hora.estimators.worker` - ``loop`` (``train_worker(spec)``, the per-rank training loop),
  ``batches``, ``feed`` (data wait, device feed)
* :mod:`hora.estimators.frameworks` - ``torch/`` (``codec``, ``session``, ``strategies``, ``tensors``,
  ``dcp``), ``keras/`` (``codec``, ``session``, ``io``), ``lightning``
* :mod:`hora.estimators.faces` - ``spark`` (``hora.spark``), ``sklearn`` (``hora.dask``: pandas, Dask,
  Ray): the bases of the estimator classes written in ``hora.spark.*.estimator`` and ``hora.dask``;
  ``horovod`` (Horovod's methods), ``history`` (``plot_history``)

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
