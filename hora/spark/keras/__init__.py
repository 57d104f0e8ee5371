"""``hora.spark.keras`` (Horovod's ``horovod.spark.keras``): ``KerasEstimator`` and ``KerasModel`` on Spark.

The classes live in :mod:`hora.spark.keras.estimator` (Horovod's path); importing this
package does not import TensorFlow (a fit, a transform or a load does). :mod:`hora.spark.keras.remote`
and :mod:`hora.spark.keras.util` name Horovod's internals, which hora does not have.
"""

from hora.spark.keras.estimator import EstimatorParams, KerasEstimator, KerasModel

__all__ = ["KerasEstimator", "KerasModel", "EstimatorParams"]
