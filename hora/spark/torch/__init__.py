"""``hora.spark.torch`` (Horovod's ``horovod.spark.torch``): ``TorchEstimator`` and ``TorchModel`` on Spark.

The classes live in :mod:`hora.spark.torch.estimator` (Horovod's path); ``from hora.spark
import TorchEstimator`` is the same class. :mod:`hora.spark.torch.remote` names Horovod's
training-loop internals, which hora does not have.
"""

from hora.spark.torch.estimator import EstimatorParams, TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel", "EstimatorParams"]
