"""``hora.spark.keras.estimator`` (Horovod's path): ``KerasEstimator``, ``KerasModel`` and ``EstimatorParams``.

Built from the Keras framework descriptor (:mod:`hora.estimators.keras`) by the Spark
face (:mod:`hora.estimators.spark_face`). Importing this module imports TensorFlow.
"""

from hora.estimators import spark_face
from hora.estimators.keras import KERAS
from hora.spark.common.params import EstimatorParams

KerasEstimator, KerasModel = spark_face.build(KERAS, "hora.spark.keras", "KerasEstimator", "KerasModel")

__all__ = ["KerasEstimator", "KerasModel", "EstimatorParams"]
