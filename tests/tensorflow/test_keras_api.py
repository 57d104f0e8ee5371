"""hora.tensorflow.keras (Horovod's path), SyncBatchNormalization, the partial tape, the optimizers'
Horovod arguments, and elastic training with an injected HorovodInternalError, on 2 real processes.

One launch runs every scenario (TensorFlow is slow to import); the worker returns what it
saw and the assertions run here.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.spawn_util import run_ranks

pytestmark = pytest.mark.tf


def _sync_bn_part(tf, keras, hvd, r: int) -> dict:
    """SyncBatchNormalization on uneven shards (1 and 3 rows) == BatchNormalization on the whole batch."""
    full = np.arange(16, dtype="float32").reshape(4, 2, 2) ** 1.5
    rows = slice(0, 1) if r == 0 else slice(1, 4)
    bn = keras.layers.BatchNormalization(axis=1)
    sync = hvd.SyncBatchNormalization(axis=1)
    weights = tf.constant(np.linspace(0.5, 2.0, 16, dtype="float32").reshape(4, 2, 2))
    x_full, x_part = tf.constant(full), tf.constant(full[rows])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x_full, x_part])
        ref = bn(x_full, training=True)
        got = sync(x_part, training=True)
        l_ref = tf.reduce_sum(ref * weights)
        l_got = tf.reduce_sum(got * weights[rows])
    return {
        "sync_out": (got.numpy(), ref.numpy()[rows]),
        "sync_moving": (sync.moving_mean.numpy(), bn.moving_mean.numpy(), sync.moving_variance.numpy(),
                        bn.moving_variance.numpy()),
        # the cross-rank part of the input gradient travels back through the allreduce
        "sync_grad": (tape.gradient(l_got, x_part).numpy(), tape.gradient(l_ref, x_full).numpy()[rows]),
        "sync_fused_error": _raises(lambda: hvd.SyncBatchNormalization(fused=True), ValueError),
    }


def _tapes_and_optimizers_part(tf, keras, hvd, hk, r: int) -> dict:
    out: dict = {}
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="local"), keras.layers.Dense(1)])
    x = tf.constant(np.full((1, 3), r + 1.0, "float32"))
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(model(x))
    plain = tape.gradient(loss, model.trainable_weights)
    partial = hvd.PartialDistributedGradientTape(tape, local_layers=model.layers[0])
    got = partial.gradient(loss, model.trainable_weights)
    local, global_ = partial.get_local_and_global_gradients(loss, model.trainable_weights)
    out["partial"] = ([g.numpy() for g in plain], [g.numpy() for g in got], len(local), len(global_))
    out["partial_bad_layer"] = _raises(lambda: hvd.PartialDistributedGradientTape(tape, local_layers=[object()]),
                                       ValueError)

    # hvd.DistributedOptimizer (the TensorFlow entry) on a Keras optimizer, with groups and a local variable
    a, b, c = (keras.Variable(np.zeros(2, "float32"), name=n) for n in "abc")
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), groups=2)
    opt.register_local_var(c)
    g = [tf.constant([1.0, 2.0]) * (r + 1)] * 3
    opt.apply(g, [a, b, c])
    out["keras_opt"] = (a.numpy(), b.numpy(), c.numpy(), hk.is_distributed_optimizer(opt))
    out["keras_opt_adasum"] = _raises(lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hvd.Adasum),
                                      ValueError)

    # a tf.compat.v1.train optimizer in a TF1 graph and session
    with tf.Graph().as_default():
        w = tf.compat.v1.Variable([1.0, 1.0])
        loss = tf.reduce_sum(w * float(r + 1))
        v1 = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
        train = v1.minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            out["v1_opt"] = sess.run(w)
    return out


def _keras_path_part(tf, keras, hk, r: int, tmpdir: str) -> dict:
    import hora.keras
    import hora.tensorflow.keras as tk
    from hora.tensorflow.keras.callbacks import BestModelCheckpoint

    out: dict = {"same_objects": (tk.DistributedOptimizer is hora.keras.DistributedOptimizer
                                  and tk.callbacks.MetricAverageCallback is hora.keras.callbacks.MetricAverageCallback
                                  and BestModelCheckpoint is hora.keras.callbacks.BestModelCheckpoint
                                  and tk.elastic.KerasState is hora.keras.elastic.KerasState)}
    s = tk.allreduce(np.array([1.0, 2.0]) * (r + 1), average=False)
    out["helpers"] = (type(s).__name__, s.numpy().tolist(), tk.allgather([r]).numpy().tolist(),
                      tk.broadcast(tf.constant([r, r]), 1).numpy().tolist(),
                      tk.reducescatter(np.arange(4.0) * (r + 1)).numpy().tolist())

    class Scaled(keras.optimizers.SGD):
        pass

    keras.utils.set_random_seed(r)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    own = model.layers[0].kernel  # each rank keeps its own: not broadcast
    own_before = own.numpy().copy()  # each rank's own initial kernel (seed r)
    model.compile(optimizer=tk.DistributedOptimizer(Scaled(0.01), sparse_as_dense=True), loss="mse")
    best = BestModelCheckpoint(monitor="loss", save_weights_only=True)
    best.filepath = os.path.join(tmpdir, f"w-{r}.weights.h5")
    xs = np.ones((4, 2), "float32")
    model.fit(xs, xs[:, :1], epochs=2, verbose=0, callbacks=[
        tk.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[own]), tk.callbacks.MetricAverageCallback(),
        best])
    kernels = hora.keras.allgather_object(own.numpy())
    out["local_kept"] = (not np.allclose(kernels[0], kernels[1]), np.allclose(own_before, own.numpy(), atol=0.1))
    out["broadcast_rest"] = hora.keras.allgather_object(model.layers[1].kernel.numpy())
    out["best_written"] = os.path.exists(best.filepath)
    out["best_monitor_error"] = _raises(lambda: BestModelCheckpoint("best.keras"), Exception)
    path = os.path.join(tmpdir, f"m-{r}.keras")
    model.save(path)
    loaded = tk.load_model(path, custom_optimizers=[Scaled])
    out["loaded"] = (type(loaded.optimizer).__name__, tk.is_distributed_optimizer(loaded.optimizer))
    return out


def _elastic_tf_part(tf, hvd, r: int) -> dict:
    """hvd.elastic.run with TensorFlowState: a HorovodInternalError on both ranks at step 5 (once)."""
    from hora.errors import HorovodInternalError

    w = tf.Variable([float(r)] * 2)  # differs by rank: sync() must make it rank 0's
    state = hvd.elastic.TensorFlowState([w], step=0)
    attempts, resets = [], []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state):
        attempts.append(state.step)
        while state.step < 8:
            w.assign_add(hvd.allreduce(tf.constant([1.0, 1.0]) * (hvd.rank() + 1)))  # adds 1.5
            state.step += 1
            if state.step == 5 and len(attempts) == 1:
                raise HorovodInternalError("injected on every rank")
            if state.step % 2 == 0:
                state.commit()
        return state.step

    steps = train(state)
    return {"elastic_tf": (steps, attempts, resets, w.numpy().tolist())}


def _elastic_keras_part(tf, keras, hk, r: int) -> dict:
    """Keras elastic state and callbacks in model.fit; the second attempt's failure comes as a TensorFlow
    OpError carrying a CollectiveError (as from inside the train step)."""
    from hora.errors import HorovodInternalError

    keras.utils.set_random_seed(r)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    model.optimizer.build(model.trainable_variables)
    state = hk.elastic.KerasState(model, batch=0, epoch=0)
    fails = [HorovodInternalError("injected"), tf.errors.UnknownError(None, None, "CollectiveError: injected")]
    attempts = []

    class Fail(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if state.epoch == len(attempts) and batch == 1 and fails:
                raise fails.pop(0)

    @hk.elastic.run
    def train(state):
        attempts.append(state.epoch)
        model.fit(np.ones((8, 2), "float32"), np.zeros((8, 1), "float32"), batch_size=2,
                  epochs=4 - state.epoch, verbose=0, shuffle=False,
                  callbacks=[hk.elastic.UpdateEpochStateCallback(state), hk.elastic.UpdateBatchStateCallback(state),
                             hk.elastic.CommitStateCallback(state, batches_per_commit=2), Fail()])
        return state.epoch

    epochs = train(state)
    weights = [v.numpy() for v in model.weights]
    return {"elastic_keras": (epochs, attempts, state.batch), "elastic_weights": weights}


def _keras_worker(tmpdir: str) -> dict:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras
    import tensorflow as tf

    import hora.keras as hk
    import hora.tensorflow as hvd

    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()
    r = hvd.rank()
    out = _sync_bn_part(tf, keras, hvd, r)
    out.update(_tapes_and_optimizers_part(tf, keras, hvd, hk, r))
    out.update(_keras_path_part(tf, keras, hk, r, tmpdir))
    out.update(_elastic_tf_part(tf, hvd, r))
    out.update(_elastic_keras_part(tf, keras, hk, r))
    hvd.shutdown()
    return out


def _raises(fn, exc_type) -> bool:
    try:
        fn()
    except exc_type:
        return True
    return False


@pytest.mark.timeout(280)
def test_keras_path_sync_bn_partial_tape_and_elastic_on_two_ranks(tmp_path):
    res = run_ranks(_keras_worker, 2, args=(str(tmp_path),), timeout=250, preload=("tensorflow",))
    for r, o in enumerate(res):
        got, want = o["sync_out"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        sm, bm, sv, bv = o["sync_moving"]
        np.testing.assert_allclose(sm, bm, rtol=1e-5)
        np.testing.assert_allclose(sv, bv, rtol=1e-5)
        got, want = o["sync_grad"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        assert o["sync_fused_error"]

        plain, got, n_local, n_global = o["partial"]
        other = res[1 - r]["partial"][0]
        np.testing.assert_allclose(got[0], plain[0] / 2, rtol=1e-6)  # local layer: own gradient / size
        np.testing.assert_allclose(got[1], plain[1] / 2, rtol=1e-6)
        np.testing.assert_allclose(got[2], (plain[2] + other[2]) / 2, rtol=1e-6)  # global: the average
        assert (n_local, n_global) == (2, 2) and o["partial_bad_layer"]

        a, b, c, distributed = o["keras_opt"]
        np.testing.assert_allclose(a, [-1.5, -3.0])  # averaged gradient, one SGD step of rate 1
        np.testing.assert_allclose(b, [-1.5, -3.0])
        np.testing.assert_allclose(c, np.array([-1.0, -2.0]) * (r + 1) / 2)  # local: own gradient / size
        assert distributed and o["keras_opt_adasum"]
        np.testing.assert_allclose(o["v1_opt"], [1.0 - 0.5 * 1.5] * 2)

        assert o["same_objects"]
        kind, summed, gathered, bcast, scattered = o["helpers"]
        assert kind == "EagerTensor" and summed == [3.0, 6.0] and gathered == [0, 1] and bcast == [1, 1]
        assert scattered == ([0.0, 1.5] if r == 0 else [3.0, 4.5])
        assert o["local_kept"] == (True, True)  # not made rank 0's; trained only a little from its own start
        np.testing.assert_array_equal(o["broadcast_rest"][0], o["broadcast_rest"][1])
        assert o["best_written"] is (r == 0) and o["best_monitor_error"]
        assert o["loaded"] == ("Scaled", True)

        steps, attempts, resets, w = o["elastic_tf"]
        # restored to the commit at step 4 and retried: 8 steps of +1.5 from rank 0's start (0.0)
        assert steps == 8 and attempts == [0, 4] and resets == [2]
        np.testing.assert_allclose(w, [8 * 1.5] * 2)
        epochs, attempts, batch = o["elastic_keras"]
        # failures in global epochs 1 and 2 (after batch 1, just committed): each retry resumes at its epoch
        assert epochs == 4 and attempts == [0, 1, 2] and batch == 0, o["elastic_keras"]
    for a, b in zip(res[0]["elastic_weights"], res[1]["elastic_weights"]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.timeout(200)
def test_importing_hora_tensorflow_does_not_import_keras():
    code = ("import sys, hora.tensorflow as hvd; assert 'keras' not in sys.modules, 'keras imported'; "
            "import hora.tensorflow.keras; assert 'keras' in sys.modules; "
            "assert hvd.keras.DistributedOptimizer is hora.keras.DistributedOptimizer")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))  # TF's import: 5 s quiet, 50+ s at load 19
    assert proc.returncode == 0, proc.stderr[-3000:]
