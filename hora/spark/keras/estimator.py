"""``hora.spark.keras.estimator`` (Horovod's path): ``KerasEstimator``, ``KerasModel`` and ``EstimatorParams``.

Built from the Keras framework descriptor (:mod:`hora.estimators.frameworks.keras.codec`) by the Spark
face (:mod:`hora.estimators.faces.spark`). Importing this module imports TensorFlow.
"""

from hora.estimators.faces import spark as spark_face
from hora.estimators.frameworks.keras.codec import KERAS
from hora.spark.common.params import EstimatorParams

KerasEstimator, KerasModel = spark_face.build(KERAS, "hora.spark.keras", "KerasEstimator", "KerasModel")

__all__ = ["KerasEstimator", "KerasModel", "EstimatorParams"]
