"""hora: distributed deep-learning training for data in Spark and Dask DataFrames.

Faces:
    hora.spark      TorchEstimator / KerasEstimator as pyspark.ml Estimators
    hora.dask       the same estimators with scikit-learn conventions on a Dask cluster
    hora.torch      Horovod-style API for torch scripts (``import hora.torch as hvd``)
    hora.tensorflow, hora.keras   the same for TensorFlow and Keras 3
    hora.runners    run a function on N ranks: local processes, Spark or Dask
    hora.store      the Store, DataFrame materialization and the per-rank reader
"""

__version__ = "0.1.0"
