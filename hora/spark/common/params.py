"""``hora.spark.common.params``: Horovod's ``EstimatorParams``, the estimators' shared Spark Params.

``EstimatorParams.batch_size`` (a ``Param``), ``EstimatorParams.backend.name == "backend"``: one
``Has*`` mixin per shared parameter (:func:`hora.estimators.faces.spark.param_mixin`); every
Spark estimator of hora (``TorchEstimator``, ``KerasEstimator``, Lightning's) derives from it.
"""

from hora.estimators.faces.spark import EstimatorParams

__all__ = ["EstimatorParams"]
