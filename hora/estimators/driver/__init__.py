"""The driver's side of the estimators: what runs in the user's process around the ranks.

* :mod:`~hora.estimators.driver.fit` - ``fit``: checks before launching, materialize, launch the ranks, collect
* :mod:`~hora.estimators.driver.transform` - ``transform`` / ``predict``: batched inference on Dask, Ray and
  pandas frames (one per Source), the prediction of a batch every engine shares
* :mod:`~hora.estimators.driver.spark_transform` - Spark's: ``mapInArrow``, the model shipped to the executors
* :mod:`~hora.estimators.driver.persistence` - saving and loading models and estimators on any Store URL
* :mod:`~hora.estimators.driver.spark_python` - a failed Spark fit explained when the executors' Python lacks hora
"""
