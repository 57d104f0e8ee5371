"""The estimator classes users import, built from a framework descriptor over the shared driver.

* :mod:`~hora.estimators.faces.spark` - the Spark ML face (``hora.spark``): Params, ``fit``, ``transform``,
  ``write()`` / ``read()``
* :mod:`~hora.estimators.faces.sklearn` - the scikit-learn face (``hora.dask``) on pandas, Dask and Ray frames
* :mod:`~hora.estimators.faces.horovod` - Horovod's estimator and model methods the Spark face adds
* :mod:`~hora.estimators.faces.history` - ``plot_history``, shared by both faces
"""
