"""``hora.spark.common.params``: Horovod's ``EstimatorParams``, the estimators' shared Spark Params.

``EstimatorParams.batch_size`` (a ``Param``), ``EstimatorParams.backend.name == "backend"``: one
Param per shared parameter with its ``get<Name>`` / ``set<Name>`` accessors
(:func:`hora.estimators.faces.spark.declare_params`); every Spark estimator of hora
(``TorchEstimator``, ``KerasEstimator``, ``LightningEstimator``) derives from it.
"""

from hora.estimators.faces.spark import EstimatorParams

__all__ = ["EstimatorParams"]
