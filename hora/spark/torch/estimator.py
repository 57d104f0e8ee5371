"""``hora.spark.torch.estimator`` (Horovod's path): ``TorchEstimator``, ``TorchModel`` and ``EstimatorParams``.

Built from the Torch framework descriptor (:mod:`hora.estimators.frameworks.torch.codec`) by the Spark
face (:mod:`hora.estimators.faces.spark`); ``from hora.spark import TorchEstimator`` is
the same class.
"""

from hora.estimators.faces import spark as spark_face
from hora.estimators.frameworks.torch.codec import TORCH
from hora.horovod_internals import module_getattr
from hora.spark.common.params import EstimatorParams

TorchEstimator, TorchModel = spark_face.build(TORCH, "hora.spark.torch", "TorchEstimator", "TorchModel")

__getattr__ = module_getattr(__name__, {
    "_torch_param_serialize": "hora saves an estimator's JSON Params as Spark metadata and pickles the others as "
                              "side files (hora.estimators.faces.spark); backend is never saved",
})

__all__ = ["TorchEstimator", "TorchModel", "EstimatorParams"]
