"""The Horovod names hora.tensorflow adds, on 2 and 3 real processes.

Each launch runs many checks (TensorFlow is slow to import); the workers return what
they saw and the assertions run here. Covered: the rank/size ops (eager, tf.function,
a tf.compat.v1 session), grouped_allgather / grouped_reducescatter (with scale factors,
uneven blocks, dtypes the backends cannot move), Horovod's integer arithmetic,
``average=`` and ``op=None``, IndexedSlices with and without ``dense_shape``, the
TensorFlow error types and an engine that keeps working after a failed op, several
independent ops in one session step, compression, process sets.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.spawn_util import run_ranks

pytestmark = pytest.mark.tf


def _quiet_tf():
    import os

    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    return tf


def _two_rank_worker() -> dict:
    import warnings

    tf = _quiet_tf()
    import hora.tensorflow as hvd
    from hora.errors import CollectiveError, DataError

    hvd.init()
    r = hvd.rank()
    out: dict = {}

    # ---- rank/size ops: eager, inside tf.function, read when a v1 graph runs
    out["ops_eager"] = [int(op()) for op in (hvd.rank_op, hvd.size_op, hvd.local_rank_op, hvd.local_size_op,
                                             hvd.process_set_included_op)]
    out["ops_function"] = [int(x) for x in tf.function(lambda: [hvd.rank_op(), hvd.size_op()])()]
    with tf.Graph().as_default():
        graph_ops = [hvd.rank_op(), hvd.size_op(), hvd.local_size_op()]
        with tf.compat.v1.Session() as sess:
            out["ops_v1"] = [int(x) for x in sess.run(graph_ops)]

    # ---- grouped_allgather: uneven first dimension, dtypes the backends cannot move as such
    parts = [tf.fill([r + 1, 2], r % 2 == 1), tf.cast(tf.fill([r + 1], 60000 + r), tf.uint16),
             tf.cast(tf.fill([2], 1.5 + r), tf.bfloat16), tf.constant([[r, -r]], tf.int8)]
    gathered = hvd.grouped_allgather(parts)
    out["gathered"] = [(g.dtype.name, g.numpy().astype("float64").tolist()) for g in gathered]

    # ---- grouped_reducescatter: Sum with scale factors, Average, uneven blocks
    x = tf.reshape(tf.range(10, dtype=tf.float32), [5, 2]) * (r + 1)
    rs = hvd.grouped_reducescatter([x, tf.cast(x, tf.int32)], op=hvd.Sum, prescale_factor=0.5,
                                   postscale_factor=3.0)
    out["rs"] = [t.numpy().tolist() for t in rs]
    out["rs_avg"] = hvd.grouped_reducescatter([x])[0].numpy().tolist()
    out["rs_scalar_error"] = _error_type(lambda: hvd.reducescatter(tf.constant(1.0)))

    # ---- Horovod's integer arithmetic: scale in float64 and truncate; the average truncates too
    ints = tf.constant([-3, 5, -7], tf.int32) * (r + 1)  # sums -9, 15, -21
    out["int_avg"] = hvd.allreduce(ints).numpy().tolist()
    out["int_pre"] = hvd.allreduce(ints, op=hvd.Sum, prescale_factor=0.5).numpy().tolist()
    out["int_post"] = hvd.allreduce(ints, op=hvd.Sum, postscale_factor=0.5).numpy().tolist()

    # ---- average= (deprecated, warns) and op=None (Average)
    y = tf.constant([1.0, 3.0]) * (r + 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["avg_false"] = hvd.allreduce(y, average=False).numpy().tolist()
        out["avg_true"] = hvd.grouped_allreduce([y], average=True)[0].numpy().tolist()
    out["deprecations"] = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    out["op_none"] = hvd.allreduce(y, op=None).numpy().tolist()

    # ---- IndexedSlices: with and without dense_shape, mixed with dense tensors, Average divides
    values = tf.constant([[1.0, 2.0]]) * (r + 1)
    with_shape = tf.IndexedSlices(values, tf.constant([r]), dense_shape=tf.constant([3, 2]))
    without = tf.IndexedSlices(tf.cast(values, tf.int32), tf.constant([2 - r]))
    red = hvd.grouped_allreduce([with_shape, y, without], op=hvd.Average)
    out["sparse_with"] = (red[0].values.numpy().tolist(), red[0].indices.numpy().tolist(),
                          tf.convert_to_tensor(red[0]).numpy().tolist())
    out["sparse_dense_part"] = red[1].numpy().tolist()
    out["sparse_without"] = (red[2].values.dtype.name, red[2].values.numpy().tolist(),
                             red[2].indices.numpy().tolist(), red[2].dense_shape is None)
    out["sparse_errors"] = [_error_type(lambda op=op: hvd.allreduce(with_shape, op=op))
                            for op in (hvd.Min, hvd.Max, hvd.Product, hvd.Adasum)]
    out["sparse_scale_error"] = _error_type(lambda: hvd.allreduce(with_shape, op=hvd.Sum, prescale_factor=2.0))

    # ---- errors have hora's class and TensorFlow's; the engine works after each
    mismatch = []
    for fn in (lambda: hvd.allreduce(tf.zeros([r + 2])), lambda: hvd.allgather(tf.zeros([2, r + 2])),
               lambda: hvd.broadcast(tf.zeros([2]), root_rank=r),
               lambda: hvd.allreduce(tf.zeros([2], [tf.int32, tf.float32][r]))):
        try:
            fn()
            mismatch.append(None)
        except CollectiveError as exc:
            mismatch.append((isinstance(exc, tf.errors.FailedPreconditionError), type(exc).__name__))
        mismatch.append(hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy().tolist())  # the engine still works
    out["mismatch"] = mismatch
    try:
        hvd.alltoall(tf.ones([3]))  # 3 rows do not split over 2 ranks
        out["a2a_error"] = None
    except DataError as exc:
        out["a2a_error"] = isinstance(exc, tf.errors.InvalidArgumentError)
    try:
        hvd.allreduce(tf.constant([True]))
        out["bool_reduce"] = None
    except DataError as exc:
        out["bool_reduce"] = "bool" in str(exc)
    out["a2a_single"] = type(hvd.alltoall(tf.constant([1.0, 2.0]) + r)).__name__
    a2a, received = hvd.alltoall(tf.constant([10, 11, 12]) + r, splits=[1, 2])
    out["a2a"] = (a2a.numpy().tolist(), received.numpy().tolist())

    # ---- broadcast_ in place, on bool and float variables
    flags, weights = tf.Variable([r == 1, r == 0]), tf.Variable([float(r)] * 3)
    new = hvd.broadcast_([flags, weights], root_rank=1)
    out["bcast_inplace"] = (flags.numpy().tolist(), weights.numpy().tolist(), [t.numpy().tolist() for t in new])
    try:
        hvd.broadcast_global_variables(0)
        out["bgv_eager"] = None
    except RuntimeError as exc:
        out["bgv_eager"] = "eager" in str(exc)

    # ---- a v1 graph: many independent ops in one session step (each holds a thread while it waits),
    #      in-place broadcast of global variables, objects while building the graph, gradients
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable([float(r + 1)] * 2, name="gv")
        bcast = hvd.broadcast_global_variables(root_rank=1)
        many = [hvd.allreduce(tf.fill([k + 1], float(k + r)), op=hvd.Sum) for k in range(24)]
        many += [hvd.allgather(tf.fill([r + 1], k)) for k in range(8)]
        src = tf.constant([1.0, 2.0]) * (r + 1)
        grad = tf.gradients(hvd.allgather(src), src, tf.ones([4]))[0]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(bcast)
            out["v1_bcast"] = sess.run(v).tolist()
            results = sess.run(many)
            out["v1_many"] = [res.tolist() for res in results]
            out["v1_grad"] = sess.run(grad).tolist()
        out["v1_object"] = hvd.broadcast_object({"r": r}, root_rank=1)
        out["v1_objects"] = hvd.allgather_object(r * 10)

    # ---- compression: the built-in ones (on the engine's fused buffer) and one of the user's (in TF)
    class Halve:
        @staticmethod
        def compress(t):
            return t * 0.5, None

        @staticmethod
        def decompress(t, ctx):
            return t * 2.0

    z = tf.constant([1.0, 2.0, 3.0], tf.float64) * (r + 1)
    out["fp16"] = hvd.allreduce(z, op=hvd.Sum, compression=hvd.Compression.fp16)
    out["fp16"] = (out["fp16"].dtype.name, out["fp16"].numpy().tolist())
    out["custom_comp"] = hvd.allreduce(z, op=hvd.Sum, compression=Halve).numpy().tolist()
    c, ctx = hvd.Compression.fp16.compress(z)
    out["compress_fp16"] = (c.dtype.name, hvd.Compression.fp16.decompress(c, ctx).dtype.name)

    # ---- gradients of the grouped ops (Horovod's definitions)
    a, b = tf.Variable(tf.ones([r + 1, 2])), tf.Variable(tf.ones([4, 2]))
    with tf.GradientTape(persistent=True) as tape:
        ga = hvd.grouped_allgather([a * 1.0])[0]
        rb = hvd.grouped_reducescatter([b * 1.0], op=hvd.Sum)[0]
        la = tf.reduce_sum(ga * float(r + 1))
        lb = tf.reduce_sum(rb * float(r + 1))
    out["grad_grouped_allgather"] = tape.gradient(la, a).numpy().tolist()
    out["grad_grouped_reducescatter"] = tape.gradient(lb, b).numpy().tolist()

    out["adasum"] = _adasum(tf, hvd, r)
    hvd.shutdown()
    return out


def _adasum(tf, hvd, r) -> object:
    """Adasum through the engine when it has it (compared with hora.native), else NotImplementedError."""
    import hora.native as hn

    x = np.array([1.0, 2.0, -1.0, 0.5], "float32") * (r + 1)
    try:
        got = hvd.allreduce(tf.constant(x), op=hvd.Adasum).numpy()
    except NotImplementedError as exc:
        return ("not implemented", "Adasum" in str(exc))
    return ("engine", np.allclose(got, np.asarray(hn.allreduce(x, op=hvd.Adasum)), rtol=1e-6))


def _error_type(fn) -> str:
    """The class name of what ``fn`` raised, ``+tf`` when it is also a TensorFlow OpError."""
    import tensorflow as tf

    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test reports which error
        return type(exc).__name__ + ("+tf" if isinstance(exc, tf.errors.OpError) else "")
    return "no error"


@pytest.mark.timeout(280)
def test_horovod_api_on_two_ranks():
    res = run_ranks(_two_rank_worker, 2, timeout=250, preload=("tensorflow",))
    for r, o in enumerate(res):
        assert o["ops_eager"] == [r, 2, r, 2, 1] and o["ops_function"] == [r, 2] and o["ops_v1"] == [r, 2, 2]
        assert o["gathered"] == [
            ("bool", [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]),
            ("uint16", [60000.0, 60001.0, 60001.0]),
            ("bfloat16", [1.5, 1.5, 2.5, 2.5]),
            ("int8", [[0.0, 0.0], [1.0, -1.0]]),
        ]
        total = np.arange(10, dtype="float64").reshape(5, 2) * 3
        rows = slice(0, 3) if r == 0 else slice(3, 5)  # 5 rows: the first rank gets the extra one
        np.testing.assert_allclose(o["rs"][0], (total * 0.5 * 3.0)[rows])
        # integers: each rank's prescale truncates, then the sum, then postscale truncates
        pre = [np.trunc(np.arange(10).reshape(5, 2) * k * 0.5) for k in (1, 2)]
        np.testing.assert_array_equal(o["rs"][1], np.trunc((pre[0] + pre[1]) * 3.0)[rows])
        np.testing.assert_allclose(o["rs_avg"], (total / 2)[rows])
        assert o["rs_scalar_error"] == "DataError+tf"
        assert o["int_avg"] == [-4, 7, -10]  # truncated toward zero, as Horovod (floor would give -5, 7, -11)
        assert o["int_pre"] == [-1 + -3, 2 + 5, -3 + -7]
        assert o["int_post"] == [-4, 7, -10]
        assert o["avg_false"] == [3.0, 9.0] and o["avg_true"] == [1.5, 4.5] and o["op_none"] == [1.5, 4.5]
        assert len(o["deprecations"]) == 2 and "replaced with `op`" in o["deprecations"][0]
        values, indices, dense = o["sparse_with"]
        assert values == [[0.5, 1.0], [1.0, 2.0]] and indices == [0, 1]
        assert dense == [[0.5, 1.0], [1.0, 2.0], [0.0, 0.0]]
        assert o["sparse_dense_part"] == [1.5, 4.5]
        dtype, values, indices, no_shape = o["sparse_without"]
        assert dtype == "float64" and values == [[0.5, 1.0], [1.0, 2.0]] and indices == [2, 1] and no_shape
        assert o["sparse_errors"] == ["NotImplementedError"] * 4
        assert o["sparse_scale_error"] == "NotImplementedError"
        for k in range(0, 8, 2):
            assert o["mismatch"][k] == (True, "CollectiveError"), o["mismatch"]
            assert o["mismatch"][k + 1] == [2.0, 2.0]
        assert o["a2a_error"] is True and o["bool_reduce"] is True
        assert o["a2a_single"] == "EagerTensor"
        assert o["bcast_inplace"] == ([True, False], [1.0] * 3, [[True, False], [1.0] * 3])
        assert o["bgv_eager"] is True
        assert o["v1_bcast"] == [2.0, 2.0]
        assert o["v1_many"][:24] == [[float(2 * k + 1)] * (k + 1) for k in range(24)]
        assert o["v1_many"][24:] == [[k, k, k] for k in range(8)]
        assert o["v1_grad"] == [1.0, 1.0]  # Average of the upstream ones, this rank's rows
        assert o["v1_object"] == {"r": 1} and o["v1_objects"] == [0, 10]
        assert o["fp16"] == ("float64", [3.0, 6.0, 9.0]) and o["custom_comp"] == [3.0, 6.0, 9.0]
        assert o["compress_fp16"] == ("float16", "float64")
        np.testing.assert_allclose(o["grad_grouped_allgather"], np.full([r + 1, 2], 1.5))
        np.testing.assert_allclose(o["grad_grouped_reducescatter"], [[2.0, 2.0]] * 2 + [[4.0, 4.0]] * 2)
        assert o["adasum"] in (("not implemented", True), ("engine", True)), o["adasum"]
    assert res[0]["a2a"] == ([10, 11], [1, 1]) and res[1]["a2a"] == ([11, 12, 12, 13], [2, 2])


def _three_rank_worker() -> dict:
    tf = _quiet_tf()
    import hora.tensorflow as hvd

    hvd.init()
    r = hvd.rank()
    out: dict = {}
    pair = hvd.add_process_set([0, 2])
    out["ps_ops"] = (int(hvd.size_op(process_set_id=pair.process_set_id)),
                     int(hvd.process_set_included_op(process_set_id=pair.process_set_id)))
    x = tf.constant([1.0, 2.0]) * (r + 1)
    if r in (0, 2):
        out["ps_sum"] = hvd.allreduce(x, op=hvd.Sum, process_set=pair).numpy().tolist()
        s = tf.IndexedSlices(tf.constant([[float(r)]]), tf.constant([r]))
        red = hvd.allreduce(s, process_set=pair)
        out["ps_sparse"] = (red.values.numpy().tolist(), red.indices.numpy().tolist())
    # reducescatter of 7 rows over 3 ranks: 3, 2, 2
    t = tf.reshape(tf.range(14, dtype=tf.float32), [7, 2])
    out["rs_rows"] = hvd.reducescatter(t, op=hvd.Sum).numpy().tolist()
    # IndexedSlices Average over 3 ranks; grouped allgather of uneven parts
    s = tf.IndexedSlices(tf.fill([1, 2], float(3 * (r + 1))), tf.constant([r]), dense_shape=[3, 2])
    out["sparse_avg"] = tf.convert_to_tensor(hvd.allreduce(s)).numpy().tolist()
    out["gathered"] = [g.numpy().tolist() for g in hvd.grouped_allgather([tf.fill([r], r), tf.fill([1], r > 0)])]
    # tape over a 3-rank job: the average of the ranks' gradients, a local source kept (scaled 1/size)
    w, local = tf.Variable([1.0, 1.0]), tf.Variable([2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * float(r + 1)) + tf.reduce_sum(local * float(r + 1))
    tape = hvd.DistributedGradientTape(tape)
    tape.register_local_source(local)
    g_w, g_local = tape.gradient(loss, [w, local])
    out["tape"] = (g_w.numpy().tolist(), g_local.numpy().tolist())
    hvd.remove_process_set(pair)
    hvd.shutdown()
    return out


@pytest.mark.timeout(240)
def test_horovod_api_on_three_ranks():
    res = run_ranks(_three_rank_worker, 3, timeout=200, preload=("tensorflow",))
    for r, o in enumerate(res):
        assert o["ps_ops"] == (2, int(r in (0, 2)))
        if r in (0, 2):
            assert o["ps_sum"] == [4.0, 8.0]
            assert o["ps_sparse"] == ([[0.0], [1.0]], [0, 2])
        rows = {0: range(0, 3), 1: range(3, 5), 2: range(5, 7)}[r]
        assert o["rs_rows"] == [[3.0 * 2 * k, 3.0 * (2 * k + 1)] for k in rows]
        assert o["sparse_avg"] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
        assert o["gathered"] == [[1, 2, 2], [False, True, True]]
        assert o["tape"][0] == [2.0, 2.0]  # the mean of 1, 2, 3
        assert o["tape"][1] == pytest.approx([(r + 1) / 3])  # local: this rank's own gradient / size
