"""``hora.spark.lightning`` (Horovod's ``horovod.spark.lightning``): the Lightning estimator on Spark.

``TorchEstimator`` takes a ``LightningModule`` (Horovod's name; ``hora.spark.LightningEstimator``
is the same class) and ``fit`` returns a ``TorchModel``. Built from the Lightning
framework descriptor (:mod:`hora.estimators.frameworks.lightning`) by the Spark face; it needs
Lightning 2.6 (``pip install 'hora[lightning]'``), imported when training starts.
"""

from hora.spark.lightning.estimator import MIN_PL_VERSION, TorchEstimator, TorchModel

LightningEstimator, LightningModel = TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel", "LightningEstimator", "LightningModel", "MIN_PL_VERSION"]
