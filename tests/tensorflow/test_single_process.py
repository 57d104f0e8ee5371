"""hora.tensorflow / hora.keras in one process: the bridge, bad input, persistence of the optimizer."""

from __future__ import annotations

import numpy as np
import pytest

from hora.errors import ConfigError, DataError, NotInitializedError

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import hora.keras as hk  # noqa: E402
import hora.tensorflow as hvd  # noqa: E402
from hora.tensorflow import mpi_ops  # noqa: E402

pytestmark = pytest.mark.tf


@pytest.mark.timeout(60)
def test_ops_before_init_raise_not_initialized():
    import hora.native as hn

    hn.shutdown()
    with pytest.raises(NotInitializedError, match="hora.init"):
        hvd.allreduce(tf.ones([2]))
    with pytest.raises(NotInitializedError):
        hvd.broadcast_variables([tf.Variable([1.0])], 0)


def _aligned(n: int, offset: int = 0) -> np.ndarray:
    buf = np.empty(n * 4 + 128, np.uint8)
    start = (-buf.ctypes.data) % 64 + offset
    return buf[start:start + n * 4].view(np.float32)


@pytest.mark.timeout(60)
def test_bridge_copies_at_most_once_each_way():
    t = tf.constant(np.arange(1000, dtype=np.float32))
    view = mpi_ops.to_numpy(t)
    assert np.shares_memory(view, t._numpy())  # in: a view of the tensor's buffer, no copy
    v = tf.Variable(np.ones(8, np.float32))
    np.testing.assert_array_equal(mpi_ops.to_numpy(v), np.ones(8))

    fresh = np.empty(1000, np.float32)
    fresh[:] = 1.0
    if fresh.ctypes.data % 64 == 0:  # an owned, aligned result is aliased (no copy back)
        out = mpi_ops.from_numpy(fresh)
        fresh[0] = 42.0
        assert float(out[0]) == 42.0
    borrowed = _aligned(1000)
    borrowed[:] = 1.0
    out = mpi_ops.from_numpy(borrowed)  # not ours to alias: one copy
    borrowed[0] = 42.0
    assert float(out[0]) == 1.0
    aliased = mpi_ops.from_numpy(borrowed, fresh=True)
    borrowed[1] = 7.0
    assert float(aliased[1]) == 7.0
    unaligned = _aligned(100, offset=4)
    unaligned[:] = 3.0
    out = mpi_ops.from_numpy(unaligned, fresh=True)  # TensorFlow cannot alias an unaligned buffer: one copy
    unaligned[0] = 0.0
    assert float(out[0]) == 3.0
    assert mpi_ops.from_numpy(np.zeros((0, 3), np.float32)).shape == (0, 3)


@pytest.mark.timeout(60)
def test_single_rank_ops_and_bad_input(hora_single):
    x = tf.constant([1.0, 2.0])
    np.testing.assert_allclose(hvd.allreduce(x).numpy(), [1.0, 2.0])
    np.testing.assert_allclose(tf.function(lambda z: hvd.allreduce(z, op=hvd.Sum))(x).numpy(), [1.0, 2.0])
    with pytest.raises(DataError, match="string"):
        hvd.allreduce(tf.constant(["a"]))
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(x, op=hvd.Sum, average=True)
    with pytest.raises(ConfigError, match="op=hora.Sum"):
        hvd.allreduce(x, hvd.Sum)  # Horovod's second positional parameter is `average`
    sparse = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), dense_shape=tf.constant([2, 2]))
    with pytest.raises(NotImplementedError, match="IndexedSlices"):
        hvd.allreduce(sparse, op=hvd.Max)
    with pytest.raises(ConfigError, match="tf.GradientTape"):
        hvd.DistributedGradientTape(object())
    with pytest.raises(ConfigError, match="tf.Variable"):
        hvd.broadcast_variables([tf.constant(1.0)], 0)
    with pytest.raises(ConfigError, match="outside tf.function"):
        tf.function(lambda: hvd.broadcast_object(1) and tf.constant(1), autograph=False)()
    with pytest.raises(ConfigError, match="keras.Model"):
        hk.broadcast_model(object())


class _FakeKeras2Adam:
    """Stands in for a tf_keras optimizer (tf_keras is not installed here): only its module matters."""


_FakeKeras2Adam.__module__ = "tf_keras.src.optimizers.adam"
_FakeKeras2Adam.__name__ = "Adam"


@pytest.mark.timeout(60)
def test_distributed_optimizer_rejects_non_keras3_optimizers(hora_single):
    with pytest.raises(ConfigError, match="Keras 2 \\(tf_keras\\) optimizer.*keras.optimizers.Adam"):
        hk.DistributedOptimizer(_FakeKeras2Adam())
    with pytest.raises(ConfigError, match="TensorFlow 1"):
        hk.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    with pytest.raises(ConfigError, match="instance"):
        hk.DistributedOptimizer(keras.optimizers.SGD)
    with pytest.raises(ConfigError, match="keras.optimizers.Optimizer"):
        hvd.DistributedOptimizer("adam")
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(0.1))
    with pytest.raises(ConfigError, match="already distributed"):
        hk.DistributedOptimizer(opt)
    with pytest.raises(ConfigError, match="backward_passes_per_step"):
        hk.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=0)
    with pytest.raises(ConfigError, match="gradient_accumulation_steps"):
        hk.DistributedOptimizer(keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), backward_passes_per_step=2)


@pytest.mark.timeout(120)
def test_saved_model_loads_plain_or_distributed_with_state(hora_single, tmp_path):
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    model.fit(x, y, epochs=2, batch_size=8, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    plain = keras.models.load_model(path)
    assert type(plain.optimizer) is keras.optimizers.Adam and not hk.is_distributed_optimizer(plain.optimizer)
    dist = hk.load_model(path)
    assert hk.is_distributed_optimizer(dist.optimizer) and isinstance(dist.optimizer, keras.optimizers.Adam)
    assert int(dist.optimizer.iterations.numpy()) == 4  # the optimizer's state came back
    np.testing.assert_allclose(dist.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)
    dist.fit(x, y, epochs=1, batch_size=8, verbose=0)
    assert int(dist.optimizer.iterations.numpy()) == 6


@pytest.mark.timeout(120)
def test_callbacks_reject_bad_configuration(hora_single, tmp_path):
    with pytest.raises(NotImplementedError, match="momentum_correction"):
        hk.callbacks.LearningRateWarmupCallback(0.1, momentum_correction=True)
    with pytest.raises(ConfigError, match="initial_lr"):
        hk.callbacks.LearningRateScheduleCallback(-1.0, 0.5)
    with pytest.raises(ConfigError, match="end_epoch"):
        hk.callbacks.LearningRateScheduleCallback(0.1, 0.5, start_epoch=3, end_epoch=2)
    with pytest.raises(ConfigError, match=".keras"):
        hk.callbacks.BestModelCheckpoint(filepath=str(tmp_path / "best.h5"))
    with pytest.raises(ConfigError, match="root_rank"):
        hk.callbacks.BroadcastGlobalVariablesCallback(-1)

    x = np.ones((8, 2), "float32")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    with pytest.raises(ConfigError, match="set filepath"):
        model.fit(x, x[:, :1], epochs=1, verbose=0, callbacks=[hk.callbacks.BestModelCheckpoint()])
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
    model.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")
    with pytest.raises(ConfigError, match="LearningRateSchedule"):
        model.fit(x, x[:, :1], epochs=1, verbose=0,
                  callbacks=[hk.callbacks.LearningRateScheduleCallback(0.1, 0.5)])
    with pytest.raises(ConfigError, match="root_rank=3"):
        model.fit(x, x[:, :1], epochs=1, verbose=0, callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(3)])


@pytest.mark.timeout(60)
def test_distributed_optimizer_keeps_keras2_names_horovod_programs_use(hora_single):
    """``opt.variables()`` and ``opt.lr`` (Keras 2 spellings in Horovod's examples) work on a distributed
    optimizer; ``BestModelCheckpoint`` takes Horovod's arguments."""
    opt = hk.DistributedOptimizer(keras.optimizers.Adam(0.01))
    opt.build([keras.Variable(np.zeros(2, "float32"))])
    assert opt.variables() == opt.variables and len(opt.variables) > 0
    tf.keras.backend.set_value(opt.lr, 0.5)  # as Horovod's elastic Keras example resets the rate
    assert float(opt.learning_rate) == pytest.approx(0.5)
    opt.lr = 0.25
    assert float(opt.learning_rate) == pytest.approx(0.25)
    best = hk.callbacks.BestModelCheckpoint(monitor="loss", save_weights_only=True)
    assert best.monitor == "loss" and best.filepath is None
    with pytest.raises(ConfigError, match="filepath="):
        hk.callbacks.BestModelCheckpoint("best.keras")
    with pytest.raises(ConfigError, match=".weights.h5"):
        hk.callbacks.BestModelCheckpoint(save_weights_only=True, filepath="w.keras")
