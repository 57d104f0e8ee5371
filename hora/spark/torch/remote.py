"""``hora.spark.torch.remote``: the internals of Horovod's Torch training loop, which hora does not have.

hora's ranks run one shared loop (:mod:`hora.estimators.worker.loop`) over a framework session
(:mod:`hora.estimators.frameworks.torch.session`); importing Horovod's names works, using them raises
(:mod:`hora.horovod_internals`).
"""

from hora.horovod_internals import module_getattr

_LOOP = "hora's ranks train in one shared loop (hora.estimators.worker.loop) over a TorchSession"
_METRICS = "hora averages each metric across ranks once per epoch (hora.estimators.worker.loop); metrics= takes callables"

__getattr__ = module_getattr(__name__, {
    "RemoteTrainer": _LOOP,
    "_pin_gpu_fn": "hora pins each rank to one GPU with use_gpu=True (hora.estimators.devices)",
    "_get_optimizer_with_unscaled_lr_fn": "hora scales the learning rate with lr_scaling= (hora.estimators.params)",
    "_metric_cls": _METRICS,
    "_construct_metric_value_holders_fn": _METRICS,
    "_get_metric_avgs_fn": _METRICS,
    "_update_metrics_fn": _METRICS,
    "_prepare_np_data_fn": "hora's reader gives each batch as numpy arrays of the stored columns (hora.store.reader)",
    "_calculate_loss_fn": "hora weighs losses with loss_weights= and sample_weight_col= in its training step "
                          "(hora.estimators.frameworks.torch.tensors)",
})
