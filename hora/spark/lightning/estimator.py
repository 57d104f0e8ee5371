"""``hora.spark.lightning.estimator`` (Horovod's path): ``TorchEstimator``, ``TorchModel`` and ``MIN_PL_VERSION``."""

from hora.estimators import spark_face
from hora.estimators.lightning import LIGHTNING
from hora.lightning._compat import MIN_PL_VERSION

TorchEstimator, TorchModel = spark_face.build(LIGHTNING, "hora.spark.lightning", "TorchEstimator", "TorchModel")

__all__ = ["TorchEstimator", "TorchModel", "MIN_PL_VERSION"]
