"""The driver's side of the estimators: what runs in the user's process around the ranks.

* :mod:`~hora.estimators.driver.fit` - ``fit``: checks before launching, materialize, launch the ranks, collect
* :mod:`~hora.estimators.driver.transform` - ``transform`` / ``predict``: batched inference on Spark, Dask,
  Ray and pandas frames
* :mod:`~hora.estimators.driver.persistence` - saving and loading models and estimators on any Store URL
* :mod:`~hora.estimators.driver.spark_python` - a failed Spark fit explained when the executors' Python lacks hora
"""
