"""``hora.spark.torch`` (Horovod's ``horovod.spark.torch``): ``TorchEstimator`` and ``TorchModel`` on Spark.

Built from the Torch framework descriptor (:mod:`hora.estimators.torch`) by the Spark
face (:mod:`hora.estimators.spark_face`); ``from hora.spark import TorchEstimator`` is
the same class.
"""

from hora.estimators import spark_face
from hora.estimators.torch import TORCH

TorchEstimator, TorchModel = spark_face.build(TORCH, __name__, "TorchEstimator", "TorchModel")

__all__ = ["TorchEstimator", "TorchModel"]
