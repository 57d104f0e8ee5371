"""Collectives of :mod:`hora.native` on TensorFlow tensors, eager and inside ``tf.function``.

The bridge between TensorFlow and the backend copies at most once each way:

* in: a CPU ``EagerTensor`` (or a variable's current value) is handed to the backend as
  a numpy *view* of its buffer (``EagerTensor._numpy()``, no copy). The backend's ops
  are out of place, so the tensor, which TensorFlow treats as immutable, is never written.
* out: the backend's result array becomes a tensor through DLPack without a copy when
  TensorFlow can alias it (a fresh, C-contiguous, 64-byte aligned numeric buffer), and
  through one ``tf.convert_to_tensor`` copy otherwise.

Inside ``tf.function`` every op is a ``tf.py_function`` whose body runs the eager path;
static shapes are restored on the outputs where they are known (all dimensions for
``allreduce``/``broadcast``, all but the first for ``allgather``/``alltoall``/
``reducescatter``). ``tf.function`` runs stateful ops, ``py_function`` included, in
program order, so every rank issues its collectives in the same order.

Gradients follow Horovod: the gradient of ``allreduce`` is the ``allreduce`` of the
upstream gradient (same op and scale factors); of ``allgather``, the ``Sum``-allreduce of
the upstream gradient sliced to this rank's rows; of ``broadcast``, the ``Sum``-allreduce
of the upstream gradient on the root and zeros elsewhere; of ``alltoall``, an
``alltoall`` back with the received splits; of ``reducescatter``, an ``allgather``
(divided by the set's size for ``Average``).

Errors: in eager mode the backend's :class:`~hora.errors.CollectiveError` (mismatched
shapes or dtypes across ranks, ...) propagates unchanged. Inside ``tf.function``
TensorFlow turns any Python exception raised by a ``py_function`` into a
``tf.errors.OpError``; its message carries the ``CollectiveError`` text.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

import hora.native as hn
from hora.errors import ConfigError

log = logging.getLogger(__name__)

_ALIGN = 64  # TensorFlow's CPU allocator alignment (EIGEN_MAX_ALIGN_BYTES); DLPack needs it
_DLPACK_KINDS = frozenset("biufc")


def _tf():
    import tensorflow as tf

    return tf


# ---------------------------------------------------------------------------------------
# Life cycle
# ---------------------------------------------------------------------------------------
_atexit_registered = False


def init(process_sets: Any = None) -> None:
    """:func:`hora.native.init`, plus a ``shutdown`` at interpreter exit.

    Horovod programs never call ``shutdown()``; without it a rank that exits first
    tears down the rendezvous under a peer still running its engine. Registering
    ``shutdown`` with :mod:`atexit` (idempotent) lets every rank leave cleanly.

    Raises:
        ConfigError, RendezvousError: from :func:`hora.native.init`.
    """
    global _atexit_registered
    hn.init(process_sets)
    if not _atexit_registered:
        atexit.register(hn.shutdown)
        _atexit_registered = True


# ---------------------------------------------------------------------------------------
# The bridge
# ---------------------------------------------------------------------------------------
def _is_keras_variable(x: Any) -> bool:
    mod = type(x).__module__
    return mod.startswith("keras") and hasattr(x, "value") and hasattr(x, "assign")


def _as_tensor(x: Any):
    """A tf.Tensor for ``x`` (a tensor, tf.Variable, keras.Variable, numpy array, scalar)."""
    tf = _tf()
    if _is_keras_variable(x):
        x = x.value
    if isinstance(x, tf.Tensor):
        return x
    return tf.convert_to_tensor(x)


def _check_dtype(t, op: str, name: str | None) -> None:
    tf = _tf()
    if t.dtype in (tf.string, tf.resource, tf.variant):
        raise ConfigError(
            f"hora.tensorflow.{op}: tensor {name or '(unnamed)'!s} has dtype {t.dtype.name}, which cannot be reduced or communicated; use a numeric dtype "
            "(or broadcast_object/allgather_object for Python objects)"
        )


def to_numpy(t) -> np.ndarray:
    """A numpy view of an eager tensor's buffer (no copy on CPU; one host copy on GPU)."""
    t = _as_tensor(t)
    get = getattr(t, "_numpy", None)
    if get is None:  # not an EagerTensor in this TensorFlow: fall back to the copying accessor
        return np.asarray(t.numpy())
    arr = get()
    return arr if isinstance(arr, np.ndarray) else np.asarray(arr)


def from_numpy(arr: np.ndarray, dtype=None, fresh: bool = False):
    """A tensor holding ``arr``: aliased through DLPack when TensorFlow can, else one copy.

    The buffer is aliased only when nothing else can write to it: ``arr`` owns it, or the
    caller says it is ``fresh`` (a result the backend allocated for this call alone).
    """
    tf = _tf()
    arr = np.asarray(arr)
    if (
        arr.size > 0
        and arr.flags.c_contiguous
        and (fresh or (arr.flags.owndata and arr.base is None))
        and arr.dtype.kind in _DLPACK_KINDS
        and arr.dtype.isnative
        and arr.ctypes.data % _ALIGN == 0
    ):
        out = tf.experimental.dlpack.from_dlpack(arr.__dlpack__())
    else:
        out = tf.convert_to_tensor(arr)
    if dtype is not None and out.dtype != dtype:
        out = tf.cast(out, dtype)
    return out


def _run(eager_fn, inputs: Sequence, tout: Sequence, shapes: Sequence):
    """Run ``eager_fn(*inputs) -> list of tensors`` now (eager) or as a ``tf.py_function``.

    ``shapes`` are the static shapes to restore on the graph outputs (``None``: unknown).
    """
    tf = _tf()
    if tf.executing_eagerly():
        return list(eager_fn(*inputs))
    outs = tf.py_function(func=lambda *xs: list(eager_fn(*xs)), inp=list(inputs), Tout=list(tout))
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    outs = list(outs)
    for o, s in zip(outs, shapes):
        if s is not None:
            o.set_shape(s)
    return outs


def _may_record() -> bool:
    """Whether a gradient tape could record an op now (always, when tracing a graph).

    Eager calls outside any ``tf.GradientTape`` skip ``tf.custom_gradient``, whose
    per-call bookkeeping costs more than a small collective.
    """
    tf = _tf()
    if not tf.executing_eagerly():
        return True
    try:
        from tensorflow.python.eager import record
    except ImportError:  # a TensorFlow without this internal: always go through custom_gradient
        return True
    return bool(record.could_possibly_record())


def _differentiable(fwd, raw):
    """``fwd`` (a ``tf.custom_gradient`` function) when a tape may record, else the plain ``raw`` op."""
    return fwd if _may_record() else raw


def _wide(t):
    """bfloat16 has no numpy/DLPack form the backends reduce: compute it in float32."""
    tf = _tf()
    return tf.cast(t, tf.float32) if t.dtype == tf.bfloat16 else t


def _scale_to(shape, first_dim_known: bool):
    tf = _tf()
    shape = tf.TensorShape(shape)
    if shape.rank is None:
        return None
    if first_dim_known or shape.rank == 0:
        return shape
    return tf.TensorShape([None] + shape.as_list()[1:])


# ---------------------------------------------------------------------------------------
# Eager kernels (numpy in the backend, tensors at the edges)
# ---------------------------------------------------------------------------------------
def _eager_grouped_allreduce(tensors, op, prescale_factor, postscale_factor, name, process_set, compression):
    dtypes = [t.dtype for t in tensors]
    arrays = [to_numpy(_wide(t)) for t in tensors]
    kwargs = dict(op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                  process_set=process_set)
    if compression is not None:
        kwargs["compression"] = compression
    if len(arrays) == 1:
        outs = [hn.allreduce(arrays[0], name=name, **kwargs)]
    else:
        outs = hn.grouped_allreduce(arrays, name=name, **kwargs)
    # native allreduce writes each result into a tensor it allocated for this call (empty_like)
    return [from_numpy(o, dt, fresh=True) for o, dt in zip(outs, dtypes)]


def _eager_allgather(t, name, process_set):
    dtype = t.dtype
    return [from_numpy(hn.allgather(to_numpy(_wide(t)), name=name, process_set=process_set), dtype)]


def _eager_broadcast(t, root_rank, name, process_set):
    dtype = t.dtype
    out = hn.broadcast(to_numpy(_wide(t)), root_rank, name=name, process_set=process_set)
    return [from_numpy(out, dtype, fresh=True)]  # native broadcast returns a clone made for this call


def _eager_alltoall(t, splits, name, process_set):
    tf = _tf()
    dtype = t.dtype
    sp = None if splits is None else np.asarray(to_numpy(splits), dtype=np.int64).reshape(-1)
    out, received = hn.alltoall(to_numpy(_wide(t)), splits=sp, name=name, process_set=process_set)
    return [from_numpy(out, dtype), tf.constant(np.asarray(received, dtype=np.int32).reshape(-1))]


def _eager_reducescatter(t, op, name, process_set):
    dtype = t.dtype
    return [from_numpy(hn.reducescatter(to_numpy(_wide(t)), op=op, name=name, process_set=process_set), dtype)]


def _set_size(process_set) -> int:
    size = getattr(process_set, "size", None)
    if callable(size):
        return int(size())
    if size is not None:
        return int(size)
    ranks = getattr(process_set, "ranks", None)
    if ranks:
        return len(ranks)
    return hn.size()


def _set_rank(process_set) -> int:
    rank = getattr(process_set, "rank", None)
    if callable(rank):
        return int(rank())
    if rank is not None:
        return int(rank)
    ranks = getattr(process_set, "ranks", None)
    if ranks:
        return list(ranks).index(hn.rank())
    return hn.rank()


def _op_name(op) -> str:
    return getattr(op, "name", str(op))


def _is_avg(op) -> bool:
    return op == hn.Average


def _is_sum(op) -> bool:
    return op == hn.Sum


# ---------------------------------------------------------------------------------------
# Public ops
# ---------------------------------------------------------------------------------------
def _check_init(opname: str) -> None:
    if not hn.is_initialized():
        from hora.errors import NotInitializedError

        raise NotInitializedError(f"hora has not been initialized; call hora.init() (before hora.tensorflow.{opname})")


def grouped_allreduce(
    tensors: Sequence[Any],
    op=None,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=None,
    compression=None,
) -> list:
    """Allreduce a list of tensors as one fused operation; returns a list of tensors.

    Differentiable: the gradient of each output is the grouped allreduce of the upstream
    gradients with the same op and scale factors (``Sum`` and ``Average`` only).

    Raises:
        NotInitializedError: before ``hora.init()``.
        ConfigError: a tensor has a non-numeric dtype, or is an ``IndexedSlices``.
        CollectiveError: ranks disagree about the tensors (in graph mode: a
            ``tf.errors.OpError`` carrying its message).
    """
    tf = _tf()
    _check_init("grouped_allreduce")
    op = hn.Average if op is None else op
    process_set = hn.global_process_set if process_set is None else process_set
    tensors = [_as_tensor(t) for t in tensors]
    if not tensors:
        return []
    for t in tensors:
        if isinstance(t, tf.IndexedSlices):
            raise ConfigError("hora.tensorflow.grouped_allreduce: IndexedSlices are not supported; use allreduce")
        _check_dtype(t, "grouped_allreduce", name)

    def raw(xs):
        return _run(
            lambda *ys: _eager_grouped_allreduce(list(ys), op, prescale_factor, postscale_factor, name,
                                                 process_set, compression),
            xs, [x.dtype for x in xs], [x.shape for x in xs],
        )

    @tf.custom_gradient
    def _fwd(*xs):
        ys = raw(list(xs))

        def grad(*dys):
            if not (_is_avg(op) or _is_sum(op)):
                raise NotImplementedError(
                    f"hora.tensorflow.allreduce: no gradient for op {_op_name(op)} (defined for Sum and Average)"
                )
            dys = [tf.zeros_like(y) if d is None else tf.convert_to_tensor(d) for d, y in zip(dys, ys)]
            return raw(dys)

        return ys, grad

    outs = _fwd(*tensors) if _may_record() else raw(tensors)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def allreduce(
    tensor: Any,
    op=None,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=None,
    compression=None,
    average: bool | None = None,
):
    """Reduce ``tensor`` across the ranks of ``process_set``; every rank gets the result.

    ``tensor`` may be a ``tf.Tensor``, ``tf.Variable``/``keras.Variable`` (its value is
    reduced; the variable is not changed) or ``tf.IndexedSlices``, whose values and indices
    are allgathered (values divided by the set's size for ``Average``), as Horovod does.
    ``average`` is Horovod's deprecated spelling of ``op=Average``/``Sum``.

    Raises:
        NotInitializedError: before ``hora.init()``.
        ConfigError: non-numeric dtype; ``Min``/``Max``/``Product`` or scale factors on
            ``IndexedSlices``.
        CollectiveError: ranks disagree about the tensor (shape, dtype, op).
    """
    tf = _tf()
    if average is not None:
        if op is not None:
            raise ConfigError("hora.tensorflow.allreduce: pass either op= or the deprecated average=, not both")
        op = hn.Average if average else hn.Sum
    op = hn.Average if op is None else op
    process_set = hn.global_process_set if process_set is None else process_set
    if isinstance(tensor, tf.IndexedSlices):
        _check_init("allreduce")
        if not (_is_avg(op) or _is_sum(op)):
            raise ConfigError(
                f"hora.tensorflow.allreduce: op {_op_name(op)} is not supported on IndexedSlices "
                "(use Sum or Average, or densify with tf.convert_to_tensor / sparse_as_dense=True)"
            )
        values = allgather(tensor.values, name=None if name is None else f"{name}.values", process_set=process_set)
        indices = allgather(tensor.indices, name=None if name is None else f"{name}.indices",
                            process_set=process_set)
        scale = prescale_factor * postscale_factor
        if _is_avg(op):
            scale = scale / _set_size(process_set)
        if scale != 1.0:
            values = values * tf.cast(scale, values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    return grouped_allreduce([tensor], op=op, name=name, prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor, process_set=process_set,
                             compression=compression)[0]


def allgather(tensor: Any, name: str | None = None, process_set=None):
    """Concatenate ``tensor`` from every rank along dimension 0 (which may differ by rank).

    Differentiable: the gradient is the ``Sum``-allreduce of the upstream gradient,
    sliced to the rows this rank contributed.

    Raises:
        NotInitializedError, ConfigError, CollectiveError: as :func:`allreduce`
        (the trailing dimensions and dtype must agree across ranks).
    """
    tf = _tf()
    _check_init("allgather")
    process_set = hn.global_process_set if process_set is None else process_set
    tensor = _as_tensor(tensor)
    _check_dtype(tensor, "allgather", name)

    def raw(x):
        return _run(lambda y: _eager_allgather(y, name, process_set), [x], [x.dtype],
                    [_scale_to(x.shape, False)])[0]

    @tf.custom_gradient
    def _fwd(x):
        y = raw(x)

        def grad(dy):
            dy = tf.convert_to_tensor(dy)
            reduced = grouped_allreduce([dy], op=hn.Sum, process_set=process_set)[0]
            dim0 = tf.reshape(tf.cast(tf.shape(x)[0], tf.int64), [1])
            sizes = tf.reshape(raw_sizes(dim0), [-1])
            r = _set_rank(process_set)
            start = tf.reduce_sum(sizes[:r])
            return reduced[start:start + sizes[r]]

        return y, grad

    def raw_sizes(d):
        return _run(lambda z: _eager_allgather(z, None, process_set), [d], [d.dtype], [None])[0]

    return _differentiable(_fwd, raw)(tensor)


def broadcast(tensor: Any, root_rank: int, name: str | None = None, process_set=None):
    """Every rank gets ``root_rank``'s ``tensor`` (a new tensor; variables are not assigned).

    Differentiable: the gradient is the ``Sum``-allreduce of the upstream gradient on the
    root, zeros on every other rank.

    Raises:
        NotInitializedError, ConfigError, CollectiveError: as :func:`allreduce`.
    """
    tf = _tf()
    _check_init("broadcast")
    process_set = hn.global_process_set if process_set is None else process_set
    tensor = _as_tensor(tensor)
    _check_dtype(tensor, "broadcast", name)

    def raw(x):
        return _run(lambda y: _eager_broadcast(y, root_rank, name, process_set), [x], [x.dtype], [x.shape])[0]

    @tf.custom_gradient
    def _fwd(x):
        y = raw(x)

        def grad(dy):
            reduced = grouped_allreduce([tf.convert_to_tensor(dy)], op=hn.Sum, process_set=process_set)[0]
            if hn.rank() != root_rank:
                return reduced * tf.cast(0, reduced.dtype)
            return reduced

        return y, grad

    return _differentiable(_fwd, raw)(tensor)


def alltoall(tensor: Any, splits: Any = None, name: str | None = None, process_set=None):
    """Send ``splits[i]`` rows of ``tensor`` to rank ``i``; returns ``(output, received_splits)``.

    Without ``splits`` dimension 0 is split evenly. Differentiable with respect to
    ``tensor``: the gradient is an ``alltoall`` of the upstream gradient back with the
    received splits.

    Raises:
        NotInitializedError, ConfigError, CollectiveError: as :func:`allreduce`.
    """
    tf = _tf()
    _check_init("alltoall")
    process_set = hn.global_process_set if process_set is None else process_set
    tensor = _as_tensor(tensor)
    _check_dtype(tensor, "alltoall", name)
    splits_t = None if splits is None else tf.cast(_as_tensor(splits), tf.int32)

    def raw(x, sp):
        if sp is None:
            return _run(lambda y: _eager_alltoall(y, None, name, process_set), [x], [x.dtype, tf.int32],
                        [_scale_to(x.shape, False), tf.TensorShape([None])])
        return _run(lambda y, s: _eager_alltoall(y, s, name, process_set), [x, sp], [x.dtype, tf.int32],
                    [_scale_to(x.shape, False), tf.TensorShape([None])])

    @tf.custom_gradient
    def _fwd(x):
        y, received = raw(x, splits_t)

        def grad(dy, _dreceived=None):
            back, _ = raw(tf.convert_to_tensor(dy), received)
            return back

        return (y, received), grad

    if not _may_record():
        out, received = raw(tensor, splits_t)
        return out, received
    out, received = _fwd(tensor)
    return out, tf.stop_gradient(received)


def reducescatter(tensor: Any, op=None, name: str | None = None, process_set=None):
    """Reduce ``tensor`` across ranks and give each rank its slice of dimension 0.

    Differentiable for ``Sum``/``Average``: the gradient is the ``allgather`` of the
    upstream gradient (divided by the set's size for ``Average``).

    Raises:
        NotInitializedError, ConfigError, CollectiveError: as :func:`allreduce`.
    """
    tf = _tf()
    _check_init("reducescatter")
    op = hn.Average if op is None else op
    process_set = hn.global_process_set if process_set is None else process_set
    tensor = _as_tensor(tensor)
    _check_dtype(tensor, "reducescatter", name)

    def raw(x):
        return _run(lambda y: _eager_reducescatter(y, op, name, process_set), [x], [x.dtype],
                    [_scale_to(x.shape, False)])[0]

    @tf.custom_gradient
    def _fwd(x):
        y = raw(x)

        def grad(dy):
            if not (_is_avg(op) or _is_sum(op)):
                raise NotImplementedError(
                    f"hora.tensorflow.reducescatter: no gradient for op {_op_name(op)} (defined for Sum and Average)"
                )
            g = allgather(tf.convert_to_tensor(dy), process_set=process_set)
            if _is_avg(op):
                g = g / tf.cast(_set_size(process_set), g.dtype)
            return g

        return y, grad

    return _differentiable(_fwd, raw)(tensor)


def barrier(process_set=None) -> None:
    """Block until every rank of ``process_set`` reaches the barrier (eager only).

    Raises:
        ConfigError: called while tracing a ``tf.function``.
        CollectiveError: a rank never arrived within the backend's timeout.
    """
    _eager_only("barrier")
    _check_init("barrier")
    hn.barrier(process_set=hn.global_process_set if process_set is None else process_set)


def join():
    """Signal that this rank has no more data; returns the last rank to join (an int32 tensor).

    Raises:
        CollectiveError: the backend failed.
    """
    tf = _tf()
    _check_init("join")
    if tf.executing_eagerly():
        return tf.constant(int(hn.join()), dtype=tf.int32)
    out = tf.py_function(func=lambda: tf.constant(int(hn.join()), dtype=tf.int32), inp=[], Tout=tf.int32)
    out.set_shape([])
    return out


def _eager_only(what: str) -> None:
    if not _tf().executing_eagerly():
        raise ConfigError(
            f"hora.tensorflow.{what} works on Python objects and must be called eagerly, not inside "
            "tf.function (it would run once at trace time)"
        )


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set=None) -> Any:
    """Return ``root_rank``'s Python object on every rank (pickled by the backend; eager only).

    Raises:
        ConfigError: called inside ``tf.function``.
        CollectiveError: the backend failed.
    """
    _eager_only("broadcast_object")
    _check_init("broadcast_object")
    return hn.broadcast_object(obj, root_rank=root_rank, name=name,
                               process_set=hn.global_process_set if process_set is None else process_set)


def allgather_object(obj: Any, name: str | None = None, process_set=None) -> list:
    """Return the list of every rank's Python object, in rank order (eager only).

    Raises:
        ConfigError: called inside ``tf.function``.
        CollectiveError: the backend failed.
    """
    _eager_only("allgather_object")
    _check_init("allgather_object")
    return hn.allgather_object(obj, name=name,
                               process_set=hn.global_process_set if process_set is None else process_set)


__all__ = [
    "init", "allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
    "barrier", "join", "broadcast_object", "allgather_object", "to_numpy", "from_numpy",
]
