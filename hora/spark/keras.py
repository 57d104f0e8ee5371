"""``hora.spark.keras`` (Horovod's ``horovod.spark.keras``): ``KerasEstimator`` and ``KerasModel`` on Spark.

Built from the Keras framework descriptor (:mod:`hora.estimators.keras`) by the Spark
face (:mod:`hora.estimators.spark_face`). Importing this module imports TensorFlow.
"""

from hora.estimators import spark_face
from hora.estimators.keras import KERAS

KerasEstimator, KerasModel = spark_face.build(KERAS, __name__, "KerasEstimator", "KerasModel")

__all__ = ["KerasEstimator", "KerasModel"]
