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
``Pipeline``, ``CrossValidator`` and ``TrainValidationSplit``. Importing ``hora.spark`` imports neither TensorFlow nor
Lightning: a fit, a transform or a load of their estimators does.
"""

from __future__ import annotations

from hora.estimators.callbacks import BestModelCheckpoint, Callback, EarlyStopping, MLflowLogger
from hora.spark.keras import KerasEstimator, KerasModel
from hora.spark.lightning import LightningEstimator, LightningModel
from hora.spark.runner import run, run_elastic  # Horovod's horovod.spark.run and run_elastic
from hora.spark.torch import TorchEstimator, TorchModel

__all__ = ["run", "run_elastic", "TorchEstimator", "TorchModel", "KerasEstimator", "KerasModel", "LightningEstimator", "LightningModel",
           "Callback", "EarlyStopping", "BestModelCheckpoint", "MLflowLogger"]
