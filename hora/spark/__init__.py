"""hora on Spark: MLlib estimators that train data-parallel on the cluster (Horovod's ``horovod.spark``).

>>> from hora.spark import TorchEstimator
>>> from hora.store import Store
>>> est = TorchEstimator(num_proc=2, store=Store.create("file:///tmp/hora-store"), model=net,
...                      optimizer=torch.optim.Adam(net.parameters(), 1e-3),
...                      loss=torch.nn.CrossEntropyLoss(), feature_cols=["features"],
...                      label_cols=["label"], batch_size=64, epochs=10, validation=0.2)
>>> model = est.fit(train_df)            # hora.spark.TorchModel, a pyspark.ml Model
>>> model.transform(test_df)             # adds a "prediction" column
>>> model.write().overwrite().save(path); TorchModel.load(path)

Horovod's paths work: :mod:`hora.spark.torch`, :mod:`hora.spark.keras`,
:mod:`hora.spark.lightning`, :mod:`hora.spark.common.store` (``Store``) and
:mod:`hora.spark.common.backend` (``SparkBackend``), :mod:`hora.spark.common.util`
(``prepare_data``), :func:`hora.spark.run_elastic`. Every estimator works in
``Pipeline``, ``CrossValidator`` and ``TrainValidationSplit``. ``KerasEstimator`` and
``LightningEstimator`` are imported on first access (importing ``hora.spark`` imports
neither TensorFlow nor Lightning).
"""

from __future__ import annotations

import importlib
from typing import Any

from hora.estimators.callbacks import BestModelCheckpoint, Callback, EarlyStopping, MLflowLogger
from hora.spark.runner import run, run_elastic  # Horovod's horovod.spark.run and run_elastic
from hora.spark.torch import TorchEstimator, TorchModel

#: names imported on first access: name -> (module, attribute)
_LAZY = {
    "KerasEstimator": ("hora.spark.keras", "KerasEstimator"),
    "KerasModel": ("hora.spark.keras", "KerasModel"),
    "LightningEstimator": ("hora.spark.lightning", "TorchEstimator"),
    "LightningModel": ("hora.spark.lightning", "TorchModel"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as exc:
            raise ImportError(f"hora.spark.{name} needs {module}, which cannot be imported: {exc}") from exc
    raise AttributeError(f"module 'hora.spark' has no attribute {name!r}")


__all__ = ["run", "run_elastic", "TorchEstimator", "TorchModel", "KerasEstimator", "KerasModel", "LightningEstimator", "LightningModel",
           "Callback", "EarlyStopping", "BestModelCheckpoint", "MLflowLogger"]
