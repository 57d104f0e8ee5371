"""The user's data as the estimators see it, on the driver and for transform.

* :mod:`~hora.estimators.data.frames` - which engine a frame is, feature inputs and groups
  (:class:`~hora.estimators.data.frames.Features`), schema checks, samples, Dask frames
* :mod:`~hora.estimators.data.columns` - the column operations fit and transform share
  (decoding, padding, collating) and the settings a fitted model keeps for them
* :mod:`~hora.estimators.data.ray_dataset` - a Ray Dataset as a fit's or a transform's input
* :mod:`~hora.estimators.data.text` - ``tokenizer=``: text columns tokenized per batch (a column operation)

Nothing here imports the rest of the estimators.
"""
