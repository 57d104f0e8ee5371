"""hora.tensorflow collectives and their gradients, eager and inside tf.function, on 2 real processes.

TensorFlow takes seconds to import on each process, so one launch checks many ops; the
worker returns what it saw and the assertions run here.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.spawn_util import run_ranks

pytestmark = pytest.mark.tf


def _collectives_worker() -> dict:
    import os

    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf

    import hora.tensorflow as hvd

    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()
    r = hvd.rank()
    out: dict = {"rank": r, "size": hvd.size(), "local_rank": hvd.local_rank()}
    x = tf.constant([1.0, 2.0, 3.0]) * (r + 1)

    # ---- eager forward
    out["avg"] = hvd.allreduce(x).numpy()
    out["sum"] = hvd.allreduce(x, op=hvd.Sum).numpy()
    out["scaled"] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25).numpy()
    out["max"] = hvd.allreduce(x, op=hvd.Max).numpy()
    ints = hvd.allreduce(tf.constant([r + 1, 10], tf.int32), op=hvd.Sum)
    out["int"], out["int_dtype"] = ints.numpy(), ints.dtype.name
    v = tf.Variable([float(r)] * 4)
    out["var"] = hvd.allreduce(v, op=hvd.Sum).numpy()
    out["var_after"] = v.numpy()
    out["fp16"] = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16).numpy()
    out["bf16"] = hvd.allreduce(tf.cast(x, tf.bfloat16), op=hvd.Sum).numpy().astype("float32")
    out["grouped"] = [t.numpy() for t in hvd.grouped_allreduce([x, tf.fill([2, 2], float(r))], op=hvd.Sum)]
    out["allgather"] = hvd.allgather(tf.fill([r + 1, 2], r)).numpy()
    out["broadcast"] = hvd.broadcast(tf.constant([r, r, r]), root_rank=1).numpy()
    send = tf.constant([[10.0 * r + i] for i in range(4)])
    splits = [1, 3] if r == 0 else [2, 2]
    a2a, recv = hvd.alltoall(send, splits=splits)
    out["alltoall"], out["alltoall_splits"] = a2a.numpy(), recv.numpy()
    rs = tf.constant([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]) * (r + 1)
    out["reducescatter"] = hvd.reducescatter(rs, op=hvd.Sum).numpy()
    out["object"] = hvd.broadcast_object({"from": r}, root_rank=1)
    out["objects"] = hvd.allgather_object(("rank", r))
    hvd.barrier()

    # ---- tf.function forward: values and static shapes
    @tf.function
    def graph_ops(t, send, splits):
        a = hvd.allreduce(t, op=hvd.Sum)
        g = hvd.allgather(t)
        b = hvd.broadcast(t, root_rank=0)
        c, _ = hvd.alltoall(send, splits=splits)
        d = hvd.reducescatter(send, op=hvd.Sum)
        e = hvd.grouped_allreduce([t, 2.0 * t])
        return a, g, b, c, d, e

    spec = (tf.TensorSpec([3], tf.float32), tf.TensorSpec([4, 1], tf.float32), tf.TensorSpec([2], tf.int32))
    cf = graph_ops.get_concrete_function(*spec)
    out["graph_shapes"] = [o.shape.as_list() for o in tf.nest.flatten(cf.structured_outputs)]
    res = graph_ops(x, send, tf.constant(splits))
    out["graph"] = [o.numpy() for o in tf.nest.flatten(res)]

    # ---- gradients (eager and graph)
    def grads(t_ar, t_ag, t_bc, t_a2a, t_rs):
        with tf.GradientTape(persistent=True) as tape:
            for t in (t_ar, t_ag, t_bc, t_a2a, t_rs):
                tape.watch(t)
            w = float(r + 1)
            l_ar = tf.reduce_sum(hvd.allreduce(t_ar, op=hvd.Sum) * w)
            l_avg = tf.reduce_sum(hvd.allreduce(t_ar, op=hvd.Average) * w)
            l_ag = tf.reduce_sum(hvd.allgather(t_ag) * w)
            l_bc = tf.reduce_sum(hvd.broadcast(t_bc, root_rank=0) * w)
            y, _ = hvd.alltoall(t_a2a, splits=tf.constant(splits))
            l_a2a = tf.reduce_sum(y * w)
            l_rs = tf.reduce_sum(hvd.reducescatter(t_rs, op=hvd.Sum) * w)
        return [tape.gradient(l_ar, t_ar), tape.gradient(l_avg, t_ar), tape.gradient(l_ag, t_ag),
                tape.gradient(l_bc, t_bc), tape.gradient(l_a2a, t_a2a), tape.gradient(l_rs, t_rs)]

    g_inputs = (tf.ones([3]), tf.ones([r + 1, 2]), tf.ones([2]), tf.ones([4, 1]), tf.ones([4, 2]))
    out["grads_eager"] = [g.numpy() for g in grads(*g_inputs)]
    out["grads_graph"] = [g.numpy() for g in tf.function(grads)(*g_inputs)]

    # gradient through a variable read
    wv = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hvd.allreduce(wv * float(r + 1), op=hvd.Sum))
    out["grad_var"] = tape.gradient(loss, wv).numpy()

    # ---- IndexedSlices: allgather of values and indices
    s = tf.IndexedSlices(tf.constant([[1.0, 2.0]]) * (r + 1), tf.constant([r]), dense_shape=tf.constant([2, 2]))
    red = hvd.allreduce(s)
    out["sparse"] = (red.values.numpy(), red.indices.numpy(), tf.convert_to_tensor(red).numpy())

    # ---- variables
    bv = tf.Variable(tf.fill([3], float(r + 5)))
    kv = __import__("keras").Variable(np.full([2], r + 7.0, "float32"))
    hvd.broadcast_variables([bv, kv], root_rank=1)
    out["bcast_vars"] = (bv.numpy(), np.asarray(kv.numpy()))

    @tf.function
    def bcast_in_graph():
        hvd.broadcast_variables([bv], root_rank=0)

    bv.assign(tf.fill([3], float(r)))
    bcast_in_graph()
    out["bcast_vars_graph"] = bv.numpy()

    # ---- mismatched shapes: the same CollectiveError as torch, eager; an OpError carrying it in graph
    from hora.errors import CollectiveError

    try:
        hvd.allreduce(tf.zeros([r + 2]), name="mismatch.eager")
        out["mismatch_eager"] = None
    except CollectiveError as exc:
        out["mismatch_eager"] = str(exc)
    try:
        tf.function(lambda z: hvd.allreduce(z, name="mismatch.graph"))(tf.zeros([r + 2]))
        out["mismatch_graph"] = None
    except tf.errors.OpError as exc:
        out["mismatch_graph"] = f"{type(exc).__name__}: {exc.message}"
    out["join"] = int(hvd.join())
    hvd.shutdown()
    return out


@pytest.mark.timeout(240)
def test_collectives_and_gradients_on_two_ranks():
    res = run_ranks(_collectives_worker, 2, timeout=200, preload=("tensorflow",))
    x = np.array([1.0, 2.0, 3.0])
    for r, o in enumerate(res):
        assert (o["rank"], o["size"], o["local_rank"]) == (r, 2, r)
        np.testing.assert_allclose(o["avg"], 1.5 * x)
        np.testing.assert_allclose(o["sum"], 3 * x)
        np.testing.assert_allclose(o["scaled"], 3 * x * 2 * 0.25)
        np.testing.assert_allclose(o["max"], 2 * x)
        np.testing.assert_array_equal(o["int"], [3, 20])
        assert o["int_dtype"] == "int32"
        np.testing.assert_allclose(o["var"], [1.0] * 4)
        np.testing.assert_allclose(o["var_after"], [float(r)] * 4)  # reading a variable leaves it alone
        np.testing.assert_allclose(o["fp16"], 3 * x)
        np.testing.assert_allclose(o["bf16"], 3 * x)
        np.testing.assert_allclose(o["grouped"][0], 3 * x)
        np.testing.assert_allclose(o["grouped"][1], np.ones([2, 2]))
        np.testing.assert_array_equal(o["allgather"], [[0, 0], [1, 1], [1, 1]])
        np.testing.assert_array_equal(o["broadcast"], [1, 1, 1])
        assert o["object"] == {"from": 1}
        assert o["objects"] == [("rank", 0), ("rank", 1)]
        np.testing.assert_allclose(o["reducescatter"], 3 * np.array([[1.0, 1.0], [2.0, 2.0]]) + 6 * r)
        # graph mode: static shapes where known, same values as eager
        assert o["graph_shapes"] == [[3], [None], [3], [None, 1], [None, 1], [3], [3]]
        g = o["graph"]
        np.testing.assert_allclose(g[0], 3 * x)
        np.testing.assert_allclose(g[1], np.concatenate([x, 2 * x]))
        np.testing.assert_allclose(g[2], x)
        np.testing.assert_allclose(g[5], 1.5 * x)
        np.testing.assert_allclose(g[6], 3 * x)
        # gradients, Horovod's definitions; eager and graph agree
        for key in ("grads_eager", "grads_graph"):
            gr = o[key]
            np.testing.assert_allclose(gr[0], [3.0] * 3, err_msg=key)  # allreduce(Sum) of upstream (1 + 2)
            np.testing.assert_allclose(gr[1], [1.5] * 3, err_msg=key)  # allreduce(Average) of upstream
            np.testing.assert_allclose(gr[2], np.full([r + 1, 2], 1.5), err_msg=key)  # average, this rank's rows
            np.testing.assert_allclose(gr[3], [1.5, 1.5] if r == 0 else [0.0, 0.0], err_msg=key)  # average, root
            sent_to = [0] * 1 + [1] * 3 if r == 0 else [0] * 2 + [1] * 2
            np.testing.assert_allclose(gr[4], np.array([[j + 1.0] for j in sent_to]), err_msg=key)  # back
            # reducescatter(Sum): the allgather of the upstream gradients, times the size
            np.testing.assert_allclose(gr[5], np.array([[2.0, 2.0]] * 2 + [[4.0, 4.0]] * 2), err_msg=key)
        np.testing.assert_allclose(o["grad_var"], [2.0 * (r + 1)] * 2)  # Sum of upstream ones, times r + 1
        values, indices, dense = o["sparse"]
        np.testing.assert_allclose(values, [[0.5, 1.0], [1.0, 2.0]])
        np.testing.assert_array_equal(indices, [0, 1])
        np.testing.assert_allclose(dense, [[0.5, 1.0], [1.0, 2.0]])
        np.testing.assert_allclose(o["bcast_vars"][0], [6.0] * 3)
        np.testing.assert_allclose(o["bcast_vars"][1], [8.0] * 2)
        np.testing.assert_allclose(o["bcast_vars_graph"], [0.0] * 3)
        assert o["mismatch_eager"] is not None and "mismatch.eager" in o["mismatch_eager"], o["mismatch_eager"]
        assert o["mismatch_graph"] is not None and "mismatch.graph" in o["mismatch_graph"], o["mismatch_graph"]
        assert "CollectiveError" in o["mismatch_graph"]
        assert o["join"] in (0, 1)
    np.testing.assert_allclose(res[0]["alltoall"], [[0.0], [10.0], [11.0]])
    np.testing.assert_array_equal(res[0]["alltoall_splits"], [1, 2])
    np.testing.assert_allclose(res[1]["alltoall"], [[1.0], [2.0], [3.0], [12.0], [13.0]])
    np.testing.assert_array_equal(res[1]["alltoall_splits"], [3, 2])
