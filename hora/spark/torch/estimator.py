"""``hora.spark.torch.estimator`` (Horovod's path): ``TorchEstimator``, ``TorchModel`` and ``EstimatorParams``.

Built from the Torch framework descriptor (:mod:`hora.estimators.torch`) by the Spark
face (:mod:`hora.estimators.spark_face`); ``from hora.spark import TorchEstimator`` is
the same class.
"""

from hora.estimators import spark_face
from hora.estimators.torch import TORCH
from hora.horovod_internals import module_getattr
from hora.spark.common.params import EstimatorParams

TorchEstimator, TorchModel = spark_face.build(TORCH, "hora.spark.torch", "TorchEstimator", "TorchModel")

__getattr__ = module_getattr(__name__, {
    "_torch_param_serialize": "hora saves an estimator's JSON Params as Spark metadata and pickles the others as "
                              "side files (hora.estimators.spark_face); backend is never saved",
})

__all__ = ["TorchEstimator", "TorchModel", "EstimatorParams"]
