"""``hora.spark.keras.util``: the internals of Horovod's Keras data path, which hora does not have.

hora's Keras ranks read numpy batches (:mod:`hora.store.reader`) and feed them to the model
(:mod:`hora.estimators.frameworks.keras.session`); there is no ``tf.data`` pipeline of petastorm rows to
reshape. Importing Horovod's names works, using them raises (:mod:`hora.horovod_internals`).
"""

from hora.horovod_internals import module_getattr

_DATA = ("hora's Keras ranks feed numpy batches of the stored columns to the model, reshaped to input_shapes "
         "(hora.estimators.frameworks.keras.session); sparse vectors are stored with compress_sparse_cols=True")

__getattr__ = module_getattr(__name__, {
    "TFKerasUtil": _DATA,
    "_custom_sparse_to_dense_fn": _DATA,
    "_serialize_param_value": "hora saves an estimator's JSON Params as Spark metadata and pickles the others as "
                              "side files (hora.estimators.faces.spark); backend is never saved",
})
