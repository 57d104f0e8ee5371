"""``hora.spark.lightning`` (Horovod's ``horovod.spark.lightning``): the Lightning estimator on Spark.

``LightningEstimator`` takes a ``LightningModule`` and ``fit`` returns a ``LightningModel``;
``TorchEstimator`` and ``TorchModel`` are Horovod's names of the same two classes. They live in
:mod:`hora.spark.lightning.estimator` (Horovod's path) and need Lightning 2.6
(``pip install 'hora[lightning]'``), imported when training starts.
"""

from hora.spark.lightning.estimator import (
    MIN_PL_VERSION, LightningEstimator, LightningModel, TorchEstimator, TorchModel,
)

__all__ = ["TorchEstimator", "TorchModel", "LightningEstimator", "LightningModel", "MIN_PL_VERSION"]
