"""``hora.spark.lightning.remote``: the internals of Horovod's Lightning trainer, which hora does not have.

hora's Lightning ranks run Lightning's own loop through :mod:`hora.lightning.fit` on
:class:`hora.estimators.frameworks.lightning.LightningSession`; importing Horovod's names works, using
them raises (:mod:`hora.horovod_internals`).
"""

from hora.horovod_internals import module_getattr

__getattr__ = module_getattr(__name__, {
    "RemoteTrainer": "hora's Lightning ranks run Lightning's loop through hora.lightning.fit",
    "_prepare_data_fn": "hora's reader gives each batch as tensors of the stored columns (hora.estimators.frameworks.lightning)",
})
