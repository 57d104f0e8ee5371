"""``hora.spark.lightning.estimator`` (Horovod's path): ``TorchEstimator``, ``TorchModel``, ``EstimatorParams``
and ``MIN_PL_VERSION``."""

from hora.estimators.faces import spark as spark_face
from hora.estimators.frameworks.lightning import LIGHTNING
from hora.horovod_internals import module_getattr
from hora.lightning._compat import MIN_PL_VERSION
from hora.spark.common.params import EstimatorParams

TorchEstimator, TorchModel = spark_face.build(LIGHTNING, "hora.spark.lightning", "TorchEstimator", "TorchModel")

__getattr__ = module_getattr(__name__, {
    "_torch_param_serialize": "hora saves an estimator's JSON Params as Spark metadata and pickles the others as "
                              "side files (hora.estimators.faces.spark); backend is never saved",
})

__all__ = ["TorchEstimator", "TorchModel", "EstimatorParams", "MIN_PL_VERSION"]
