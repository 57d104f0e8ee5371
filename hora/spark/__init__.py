"""hora on Spark: MLlib estimators that train data-parallel on the cluster.

>>> from hora.spark import TorchEstimator
>>> from hora.store import Store
>>> est = TorchEstimator(num_proc=2, store=Store.create("file:///tmp/hora"), model=net,
...                      optimizer=torch.optim.Adam(net.parameters(), 1e-3),
...                      loss=torch.nn.CrossEntropyLoss(), feature_cols=["features"],
...                      label_cols=["label"], batch_size=64, epochs=10, validation=0.2)
>>> model = est.fit(train_df)            # hora.spark.TorchModel, a pyspark.ml Model
>>> model.transform(test_df)             # adds a "prediction" column
>>> model.write().overwrite().save(path); TorchModel.load(path)

Both classes work in ``Pipeline``, ``CrossValidator`` and ``TrainValidationSplit``.
``KerasEstimator`` / ``KerasModel`` come from :mod:`hora.estimators.keras`, imported on
first access (importing ``hora.spark`` never imports TensorFlow).
"""

from __future__ import annotations

from typing import Any

from hora.estimators.callbacks import BestModelCheckpoint, Callback, EarlyStopping
from hora.estimators.spark_estimator import TorchEstimator, TorchModel
from hora.spark.runner import run  # Horovod's horovod.spark.run

_LAZY = {"KerasEstimator": "SparkKerasEstimator", "KerasModel": "SparkKerasModel"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        try:
            module = importlib.import_module("hora.estimators.keras")
        except ImportError as exc:
            raise ImportError(f"hora.spark.{name} needs hora.estimators.keras and TensorFlow/Keras: {exc}") from exc
        for attr in (_LAZY[name], name):
            if hasattr(module, attr):
                return getattr(module, attr)
        raise AttributeError(f"hora.estimators.keras defines neither {_LAZY[name]} nor {name}")
    raise AttributeError(f"module 'hora.spark' has no attribute {name!r}")


__all__ = ["TorchEstimator", "TorchModel", "KerasEstimator", "KerasModel", "Callback", "EarlyStopping",
           "BestModelCheckpoint"]
