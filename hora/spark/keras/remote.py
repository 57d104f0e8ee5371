"""``hora.spark.keras.remote``: the internals of Horovod's Keras training loop, which hora does not have.

hora's ranks run one shared loop (:mod:`hora.estimators.worker.loop`) over a Keras session
(:mod:`hora.estimators.frameworks.keras.session`); importing Horovod's names works, using them raises
(:mod:`hora.horovod_internals`).
"""

from hora.horovod_internals import module_getattr

__getattr__ = module_getattr(__name__, {
    "RemoteTrainer": "hora's ranks train in one shared loop (hora.estimators.worker.loop) over a KerasSession",
    "_pin_gpu_fn": "hora pins each rank to one GPU with use_gpu=True (hora.estimators.devices)",
})
