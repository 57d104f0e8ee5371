"""A training rank's side of the estimators.

* :mod:`~hora.estimators.worker.loop` - ``train_worker(spec)``: the one training loop every framework's
  session runs in (epochs, metrics, checkpoints, callbacks)
* :mod:`~hora.estimators.worker.batches` - a rank's batches from the Store's reader
* :mod:`~hora.estimators.worker.feed` - the rank's data-wait clock and the device feed (batches copied to a
  CUDA device one ahead)
"""
