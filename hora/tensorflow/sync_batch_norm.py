"""``SyncBatchNormalization``: Keras batch normalization with statistics over the global batch.

In training, each rank's per-channel count, sum and sum of squares (from its local
mean and variance) are summed across ranks with one allreduce, so every rank normalizes
with the mean and variance of the whole global batch (ranks may hold different batch
sizes) and the moving statistics follow them. The allreduce's gradient (a Sum-allreduce)
carries the cross-rank part of the input gradient. Like Horovod's, it uses
``Var[x] = E[x^2] - E[x]^2``. This module imports Keras (``hora.tensorflow`` loads it on
first use of the name).
"""

from __future__ import annotations

import keras

import hora.native as hn
from hora.tensorflow import bridge, mpi_ops


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Synchronous batch normalization: statistics are synchronized across all ranks in training.

    Takes ``keras.layers.BatchNormalization``'s arguments; ``fused`` is accepted only as
    ``False`` (Horovod's signature).

    Raises:
        ValueError: ``fused=True``/``None``, or ``synchronized=True`` (Keras' own
            tf.distribute synchronization; this layer synchronizes through hora).
    """

    def __init__(self, fused: bool | None = False, **kwargs) -> None:
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        if kwargs.get("synchronized"):
            raise ValueError("SyncBatchNormalization synchronizes through hora; do not pass synchronized=True")
        if not kwargs.get("name"):
            kwargs["name"] = "sync_batch_normalization"
        super().__init__(**kwargs)

    def _moments(self, inputs, mask):
        mean, variance = super()._moments(inputs, mask)
        if not hn.is_initialized() or hn.size() == 1:
            return mean, variance
        tf = bridge.tf_module()
        if mask is None:
            shape = tf.shape(inputs)
            count = tf.reduce_prod(tf.gather(shape, list(self._reduction_axes)))
        else:  # the mask covers every axis but the (last) feature axis
            count = tf.reduce_sum(tf.cast(mask, tf.int64))
        count = tf.cast(count, mean.dtype)
        flat_mean, flat_var = tf.reshape(mean, [-1]), tf.reshape(variance, [-1])
        local = tf.concat([tf.reshape(count, [1]), count * flat_mean, count * (flat_var + tf.square(flat_mean))], 0)
        total = mpi_ops._allreduce(local, op=hn.Sum, name=None)
        n = total[0]
        channels = tf.size(flat_mean)
        group_mean = total[1:1 + channels] / n
        group_var = total[1 + channels:] / n - tf.square(group_mean)
        return tf.reshape(group_mean, tf.shape(mean)), tf.reshape(tf.maximum(group_var, 0.0), tf.shape(variance))


__all__ = ["SyncBatchNormalization"]
