"""DistributedGradientTape parity, the Keras 3 DistributedOptimizer and every callback on 2 real processes.

Parity means: two ranks, each on half of a batch, end with exactly what one process
computes on the whole batch. One launch runs every scenario (TensorFlow is slow to import).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.spawn_util import run_ranks

pytestmark = pytest.mark.tf

N, D, BATCH = 32, 5, 4


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, D)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 3.0, 0.5, 1.0], "float32") + 0.3).reshape(-1, 1).astype("float32")
    ids = rng.integers(0, 10, size=N).astype("int32")
    return x, y, ids


def _tape_part(tf, hvd, r: int) -> dict:
    x, y, ids = _data()
    rng = np.random.default_rng(1)
    w0 = rng.normal(size=(D, 1)).astype("float32")
    emb0 = rng.normal(size=(10, 1)).astype("float32")

    def loss_fn(w, b, emb, xb, yb, idb):
        pred = tf.matmul(xb, w) + b + tf.gather(emb, idb)  # the gather gives emb an IndexedSlices gradient
        return tf.reduce_mean((pred - yb) ** 2)

    w, b, emb = tf.Variable(w0), tf.Variable([0.1]), tf.Variable(emb0)

    def grads(xb, yb, idb, distributed: bool, **kw):
        with tf.GradientTape() as tape:
            loss = loss_fn(w, b, emb, xb, yb, idb)
        if distributed:
            tape = hvd.DistributedGradientTape(tape, **kw)
        gs = tape.gradient(loss, [w, b, emb])
        return gs

    out: dict = {}
    full = [tf.convert_to_tensor(g).numpy() for g in grads(x, y, ids, False)]
    sl = slice(r, None, 2)
    dist = grads(x[sl], y[sl], ids[sl], True)
    out["emb_grad_type"] = type(dist[2]).__name__
    out["tape_sparse"] = [tf.convert_to_tensor(g).numpy() for g in dist]
    dense = grads(x[sl], y[sl], ids[sl], True, sparse_as_dense=True)
    out["emb_grad_type_dense"] = type(dense[2]).__name__
    out["tape_dense"] = [g.numpy() for g in dense]
    graph = tf.function(lambda a, b_, c: [tf.convert_to_tensor(g) for g in grads(a, b_, c, True)])
    out["tape_graph"] = [g.numpy() for g in graph(x[sl], y[sl], ids[sl])]
    out["tape_full"] = full

    # five SGD steps: two ranks on half batches == one process on whole batches
    def train(distributed: bool):
        w, b, emb = tf.Variable(w0), tf.Variable([0.1]), tf.Variable(emb0)
        opt = tf.keras.optimizers.SGD(0.05)
        for step in range(5):
            rows = slice(step * 8, step * 8 + 8)
            xb, yb, idb = x[rows], y[rows], ids[rows]
            if distributed:
                xb, yb, idb = xb[r::2], yb[r::2], idb[r::2]
            with tf.GradientTape() as tape:
                loss = loss_fn(w, b, emb, xb, yb, idb)
            if distributed:
                tape = hvd.DistributedGradientTape(tape)
            opt.apply_gradients(zip(tape.gradient(loss, [w, b, emb]), [w, b, emb]))
        return [w.numpy(), b.numpy(), emb.numpy()]

    out["train_dist"], out["train_ref"] = train(True), train(False)
    return out


def _keras_part(tf, keras, hk, r: int, tmpdir: str) -> dict:
    x, y, _ = _data()
    out: dict = {}

    class Recorder(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.logs, self.lrs, self.epoch_lrs = [], [], []

        def on_train_batch_begin(self, batch, logs=None):
            self.lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch_lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))

        def on_epoch_end(self, epoch, logs=None):
            self.logs.append(dict(logs or {}))

    def build(seed):
        keras.utils.set_random_seed(seed)
        return keras.Sequential([keras.Input((D,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])

    # model.fit with DistributedOptimizer + broadcast + metric averaging, against one process
    model = build(seed=r)  # different initial weights per rank: the broadcast must make them rank 0's
    rank0_init = hk.broadcast_object(model.get_weights(), root_rank=0)
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    out["compiled_optimizer_is_keras3"] = isinstance(model.optimizer, keras.optimizers.SGD)
    before, after = Recorder(), Recorder()
    model.fit(x[r::2], y[r::2], batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0), before,
                         hk.callbacks.MetricAverageCallback(), after])
    out["fit_weights"] = [np.asarray(v) for v in model.get_weights()]
    out["logs_before"], out["logs_after"] = before.logs, after.logs
    ref = build(seed=0)
    ref.set_weights(rank0_init)
    ref.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    xs = [x[0::2], x[1::2]]
    ys = [y[0::2], y[1::2]]
    for _epoch in range(2):
        for k in range(len(xs[0]) // BATCH):
            rows = slice(k * BATCH, (k + 1) * BATCH)
            ref.train_on_batch(np.concatenate([xs[0][rows], xs[1][rows]]), np.concatenate([ys[0][rows], ys[1][rows]]))
    out["ref_weights"] = [np.asarray(v) for v in ref.get_weights()]

    # learning-rate warm-up (per batch) then a staircase schedule (per epoch); best-model checkpoint on rank 0
    rec = Recorder()
    model.fit(x[r::2], y[r::2], batch_size=BATCH, epochs=3, shuffle=False, verbose=0,
              callbacks=[hk.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2), rec])
    out["warmup_lrs"] = rec.lrs
    out["warmup_logged_lr"] = [lg.get("learning_rate") for lg in rec.logs]
    rec = Recorder()
    best = hk.callbacks.BestModelCheckpoint(monitor="loss")
    best.filepath = os.path.join(tmpdir, f"best-{r}.keras")
    model.fit(x[r::2], y[r::2], batch_size=BATCH, epochs=3, shuffle=False, verbose=0,
              callbacks=[hk.callbacks.LearningRateScheduleCallback(0.08, lambda e: 0.5 ** e, start_epoch=1),
                         hk.callbacks.MetricAverageCallback(), best, rec])
    out["schedule_epoch_lrs"] = rec.epoch_lrs
    out["best_written"] = os.path.exists(best.filepath)

    # backward_passes_per_step: two local passes, one allreduce; sum (default) or mean of the passes
    for avg in (False, True):
        for graph in (False, True):
            v = keras.Variable(np.zeros(2, "float32"))
            opt = hk.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2,
                                          average_aggregated_gradients=avg)
            opt.build([v])
            step = tf.function(lambda g: opt.apply(g, [v])) if graph else (lambda g: opt.apply(g, [v]))
            step([tf.constant([1.0, 2.0]) * (r + 1)])
            first = np.asarray(v.numpy()).copy()
            step([tf.constant([3.0, 4.0]) * (r + 1)])
            out[f"bpps_avg{avg}_graph{graph}"] = (first, np.asarray(v.numpy()), int(opt.iterations.numpy()))
    return out


def _training_worker(tmpdir: str) -> dict:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras
    import tensorflow as tf

    import hora.keras as hk
    import hora.tensorflow as hvd

    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()
    r = hvd.rank()
    out = _tape_part(tf, hvd, r)
    out.update(_keras_part(tf, keras, hk, r, tmpdir))
    hvd.shutdown()
    return out


@pytest.mark.timeout(280)
def test_tape_optimizer_and_callbacks_on_two_ranks(tmp_path):
    res = run_ranks(_training_worker, 2, args=(str(tmp_path),), timeout=250, preload=("tensorflow",))
    for r, o in enumerate(res):
        # DistributedGradientTape: half batches on two ranks == whole batch on one process
        assert o["emb_grad_type"] == "IndexedSlices" and o["emb_grad_type_dense"] != "IndexedSlices"
        for key in ("tape_sparse", "tape_dense", "tape_graph"):
            for got, want in zip(o[key], o["tape_full"]):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"rank {r} {key}")
        for got, want in zip(o["train_dist"], o["train_ref"]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        # Keras fit with the DistributedOptimizer == one process on the union of the ranks' batches
        assert o["compiled_optimizer_is_keras3"]
        for got, want, other in zip(o["fit_weights"], o["ref_weights"], res[1 - r]["fit_weights"]):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(got, other)  # identical on both ranks
        # MetricAverageCallback: logs after it are the mean of the ranks' logs before it
        for epoch in range(2):
            raw = [res[q]["logs_before"][epoch]["loss"] for q in range(2)]
            assert raw[0] != raw[1]
            assert o["logs_after"][epoch]["loss"] == pytest.approx(np.mean(raw), rel=1e-6)
        # LearningRateWarmupCallback: initial_lr / size -> initial_lr over 2 epochs of 4 batches, then held
        steps = N // 2 // BATCH
        want = [0.1 / 2 * ((e + b / steps) * (2 - 1) / 2 + 1) for e in range(2) for b in range(steps)]
        want += [0.1] * steps
        np.testing.assert_allclose(o["warmup_lrs"], want, rtol=1e-6)
        assert o["warmup_logged_lr"][-1] == pytest.approx(0.1)
        # LearningRateScheduleCallback (staircase from epoch 1): epoch 0 untouched
        np.testing.assert_allclose(o["schedule_epoch_lrs"], [0.1, 0.08 * 0.5, 0.08 * 0.25], rtol=1e-6)
        # BestModelCheckpoint writes on rank 0 only
        assert o["best_written"] is (r == 0)
        # backward_passes_per_step=2: nothing after the first pass, one update after the second
        for graph in (False, True):
            first, second, iterations = o[f"bpps_avgFalse_graph{graph}"]
            np.testing.assert_allclose(first, [0.0, 0.0])
            np.testing.assert_allclose(second, -1.5 * np.array([4.0, 6.0]))  # mean over ranks of g1 + g2
            assert iterations == 1
            first, second, iterations = o[f"bpps_avgTrue_graph{graph}"]
            np.testing.assert_allclose(first, [0.0, 0.0])
            np.testing.assert_allclose(second, -1.5 * np.array([2.0, 3.0]))  # ... of (g1 + g2) / 2
            assert iterations == 1
