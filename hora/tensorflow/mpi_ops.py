"""Collectives of :mod:`hora.native` on TensorFlow tensors, eager and in graphs (Horovod's ``mpi_ops``).

Every op works eagerly, inside ``tf.function`` and in a ``tf.compat.v1`` graph (see
:mod:`hora.tensorflow.bridge` for how tensors cross, how graph ops are named and how
errors are typed). Gradients are Horovod's:

* ``allreduce``: the allreduce of the upstream gradient, same op and scale factors;
* ``allgather``: the *Average*-allreduce of the upstream gradient, sliced to this
  rank's rows;
* ``broadcast``: the *Average*-allreduce of the upstream gradient on the root, zeros
  elsewhere;
* ``alltoall``: an ``alltoall`` of the upstream gradient back with the received splits;
* ``reducescatter``: the ``allgather`` of the upstream gradient, times the set's size
  for ``Sum``, times the scale factors.

Scaling (``prescale_factor``/``postscale_factor``) and the integer ``Average`` are the
engine's, which follows Horovod's CPU arithmetic: integer tensors are scaled in float64
and truncated toward zero, and an integer average is truncated toward zero.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Sequence
from typing import Any

import hora.native as hn
from hora.errors import ConfigError, DataError, NotInitializedError
from hora.tensorflow import bridge, kernels
from hora.tensorflow.bridge import as_tensor, from_numpy, to_numpy  # noqa: F401 (from_numpy, to_numpy: mpi_ops' names)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------
# life cycle, process sets, and the rank/size ops
# ---------------------------------------------------------------------------------------
_atexit_registered = False
_process_sets: dict[int, Any] = {}  # process_set_id -> ProcessSet, for size_op(process_set_id=...)


def init(process_sets: Any = None) -> None:
    """:func:`hora.native.init`, plus a ``shutdown`` at interpreter exit.

    Horovod programs never call ``shutdown()``; without it a rank that exits first
    tears down the rendezvous under a peer still running its engine. Registering
    ``shutdown`` with :mod:`atexit` (idempotent) lets every rank leave cleanly.

    Raises:
        ConfigError, RendezvousError: from :func:`hora.native.init`.
    """
    global _atexit_registered
    hn.init()
    for ps in process_sets or ():
        add_process_set(ps)
    if not _atexit_registered:
        atexit.register(hn.shutdown)
        _atexit_registered = True


def add_process_set(process_set: Any) -> Any:
    """:func:`hora.native.add_process_set` (collective), remembered for :func:`size_op`."""
    ps = hn.add_process_set(process_set)
    _process_sets[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set: Any) -> bool:
    """:func:`hora.native.remove_process_set` (collective)."""
    ps_id = getattr(process_set, "process_set_id", None)
    removed = hn.remove_process_set(process_set)
    _process_sets.pop(ps_id, None)
    return removed


def check_init(opname: str) -> None:
    """Raise NotInitializedError unless hora is initialized."""
    if not hn.is_initialized():
        raise NotInitializedError(f"hora has not been initialized; call hora.init() (before hora.tensorflow.{opname})")


def _ps(process_set: Any) -> Any:
    return hn.global_process_set if process_set is None else process_set


def _op_name(prefix: str, name: str | None, tensor: Any) -> str | None:
    """The engine name of an op (see :func:`hora.tensorflow.bridge.graph_op_name`); an
    op left unnamed is named by the engine, which counts unnamed ops per process set."""
    return bridge.graph_op_name(prefix, name, tensor)


def _set_by_id(process_set_id: int) -> Any:
    if process_set_id == 0:
        return hn.global_process_set
    ps = _process_sets.get(process_set_id)
    if ps is None:
        raise ConfigError(f"process set id {process_set_id} is not registered (add it with "
                          "hora.tensorflow.add_process_set)")
    return ps


def _int_op(value_fn, opname: str, name: str | None):
    """An int32 scalar op whose value is read when it runs (eager: now); ``opname`` names the
    graph op unless ``name`` does."""
    tf = bridge.tf_module()
    if tf.executing_eagerly():
        return tf.constant(int(value_fn()), dtype=tf.int32)
    out = tf.py_function(func=lambda: tf.constant(int(value_fn()), dtype=tf.int32), inp=[], Tout=tf.int32,
                         name=name or opname)
    out.set_shape([])
    return out


def size_op(process_set_id: int = 0, name: str | None = None):
    """The size of a process set (default: the job) as an int32 op, read when it runs."""
    return _int_op(lambda: _set_by_id(process_set_id).size(), "size_op", name)


def local_size_op(name: str | None = None):
    """The number of ranks on this host, as an int32 op read when it runs."""
    return _int_op(hn.local_size, "local_size_op", name)


def rank_op(name: str | None = None):
    """This process's rank, as an int32 op read when it runs."""
    return _int_op(hn.rank, "rank_op", name)


def local_rank_op(name: str | None = None):
    """This process's rank on its host, as an int32 op read when it runs."""
    return _int_op(hn.local_rank, "local_rank_op", name)


def process_set_included_op(process_set_id: int = 0, name: str | None = None):
    """1 when this process belongs to the process set, else 0 (an int32 op read when it runs)."""
    return _int_op(lambda: int(_set_by_id(process_set_id).included()), "process_set_included_op", name)


def _is(op, which) -> bool:
    return op is which or op == which


def _check_grad_op(op, what: str) -> None:
    if not (_is(op, hn.Average) or _is(op, hn.Sum)):
        raise NotImplementedError(f"hora.tensorflow.{what}: no gradient for op {getattr(op, 'name', op)} "
                                  "(defined for Sum and Average)")


# ---------------------------------------------------------------------------------------
# the ops
# ---------------------------------------------------------------------------------------
def _grouped_allreduce(tensors: Sequence[Any], name: str | None = None, op=hn.Sum, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0, ignore_name_scope: bool = False, process_set=None,
                       compression: Any = None) -> list:
    """Allreduce dense tensors as one fused operation (``compression``: a hora.native compressor).

    Raises:
        NotInitializedError, DataError, CollectiveError (also tf.errors.FailedPreconditionError).
    """
    tf = bridge.tf_module()
    check_init("grouped_allreduce")
    ps = _ps(process_set)
    tensors = [as_tensor(t) for t in tensors]
    for t in tensors:
        bridge.check_dtype(t, "allreduce", name, reduce=True)
    name = _op_name("HorovodAllreduce", name, tensors[0])

    def raw(xs, rop, pre, post, nm):
        return bridge.run(lambda *ys: kernels.k_allreduce(list(ys), rop, pre, post, nm, ps, compression),
                          xs, [x.dtype for x in xs], [x.shape for x in xs])

    if not bridge.may_record() or not all(t.dtype.is_floating for t in tensors):
        return raw(tensors, op, prescale_factor, postscale_factor, name)

    @tf.custom_gradient
    def fwd(*xs):
        ys = raw(list(xs), op, prescale_factor, postscale_factor, name)

        def grad(*dys):
            _check_grad_op(op, "allreduce")
            dys = [tf.zeros_like(y) if d is None else tf.convert_to_tensor(d) for d, y in zip(dys, ys)]
            return raw(dys, op, prescale_factor, postscale_factor,
                       _op_name("HorovodAllreduce", None, dys[0]))

        return ys, grad

    return list(fwd(*tensors))


def _allreduce(tensor: Any, name: str | None = None, op=hn.Sum, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, ignore_name_scope: bool = False, process_set=None,
               compression: Any = None):
    """Allreduce one dense tensor (Horovod's ``mpi_ops._allreduce``); see :func:`_grouped_allreduce`."""
    return _grouped_allreduce([tensor], name=name, op=op, prescale_factor=prescale_factor,
                              postscale_factor=postscale_factor, process_set=process_set,
                              compression=compression)[0]


def _gathered_rows(xs: Sequence[Any], grads: Sequence[Any], ps) -> list:
    """This rank's rows of each gathered gradient, after averaging it across the set."""
    tf = bridge.tf_module()
    n, r = ps.size(), ps.rank()
    out = []
    for x, g in zip(xs, grads):
        g = _allreduce(g, op=hn.Average, process_set=ps)
        d = tf.reshape(tf.shape(x, out_type=tf.int32)[0], [1])
        sizes = tf.reshape(allgather(d, process_set=ps), [n])
        out.append(tf.split(g, num_or_size_splits=sizes, axis=0)[r])
    return out


def grouped_allgather(tensors: Sequence[Any], name: str | None = None, ignore_name_scope: bool = False,
                      process_set=None) -> list:
    """Concatenate each tensor from every rank along dimension 0 (which may differ by rank).

    Raises:
        NotInitializedError, DataError; CollectiveError (also FailedPreconditionError):
        the trailing dimensions or the dtype differ across ranks.
    """
    tf = bridge.tf_module()
    check_init("allgather")
    ps = _ps(process_set)
    tensors = [as_tensor(t) for t in tensors]
    if not tensors:
        return []
    for t in tensors:
        bridge.check_dtype(t, "allgather", name, reduce=False)
    name = _op_name("HorovodAllgather", name, tensors[0])

    def raw(xs):
        return bridge.run(lambda *ys: kernels.k_allgather(list(ys), name, ps), xs, [x.dtype for x in xs],
                          [bridge.static_shape(x.shape, False) for x in xs])

    if not bridge.may_record() or not all(t.dtype.is_floating for t in tensors):
        return raw(tensors)

    @tf.custom_gradient
    def fwd(*xs):
        ys = raw(list(xs))

        def grad(*dys):
            dys = [tf.zeros_like(y) if d is None else tf.convert_to_tensor(d) for d, y in zip(dys, ys)]
            return _gathered_rows(xs, dys, ps)

        return ys, grad

    return list(fwd(*tensors))


def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False, process_set=None):
    """Concatenate ``tensor`` from every rank along dimension 0; see :func:`grouped_allgather`."""
    return grouped_allgather([tensor], name=name, process_set=process_set)[0]


def broadcast(tensor: Any, root_rank: int, name: str | None = None, ignore_name_scope: bool = False,
              process_set=None):
    """Every rank gets ``root_rank``'s ``tensor`` (a new tensor; variables are not assigned).

    Raises:
        NotInitializedError, DataError; ConfigError: ``root_rank`` is not in the set;
        CollectiveError (also FailedPreconditionError): shapes, dtypes or roots differ.
    """
    tf = bridge.tf_module()
    check_init("broadcast")
    ps = _ps(process_set)
    tensor = as_tensor(tensor)
    bridge.check_dtype(tensor, "broadcast", name, reduce=False)
    name = _op_name("HorovodBroadcast", name, tensor)

    def raw(x):
        return bridge.run(lambda y: kernels.k_broadcast([y], root_rank, name, ps), [x], [x.dtype], [x.shape])[0]

    if not bridge.may_record() or not tensor.dtype.is_floating:
        return raw(tensor)

    @tf.custom_gradient
    def fwd(x):
        def grad(dy):
            reduced = _allreduce(tf.convert_to_tensor(dy), op=hn.Average, process_set=ps)
            return reduced if hn.rank() == root_rank else reduced * tf.cast(0, reduced.dtype)

        return raw(x), grad

    return fwd(tensor)


def broadcast_(variables: Sequence[Any], root_rank: int, name: str | None = None, process_set=None) -> list:
    """Assign ``root_rank``'s values to ``variables`` in place; returns their new values.

    Eager: the variables are assigned before this returns. In a graph the returned
    tensors depend on the assignments.

    Raises:
        ConfigError: an element is not a variable. Otherwise as :func:`broadcast`.
    """
    tf = bridge.tf_module()
    check_init("broadcast_")
    ps = _ps(process_set)
    variables = list(variables)
    for i, v in enumerate(variables):
        if not (isinstance(v, tf.Variable) or bridge.is_keras_variable(v)):
            raise ConfigError(f"broadcast_: element {i} is a {type(v).__name__}, not a tf.Variable or keras.Variable")
    if not variables:
        return []
    values = [as_tensor(v) for v in variables]
    for v, x in zip(variables, values):
        bridge.check_dtype(x, "broadcast_", getattr(v, "name", None), reduce=False)
    name = _op_name("HorovodBroadcastInplace", name, values[0])
    new = bridge.run(lambda *xs: kernels.k_broadcast(list(xs), root_rank, name, ps), values, [x.dtype for x in values],
                     [x.shape for x in values])
    assigns = [v.assign(x) for v, x in zip(variables, new)]
    if tf.executing_eagerly():
        return [as_tensor(v) for v in variables]
    with tf.control_dependencies([a for a in assigns if a is not None]):
        return [tf.identity(v.read_value() if hasattr(v, "read_value") else as_tensor(v)) for v in variables]


def alltoall(tensor: Any, splits: Any = None, name: str | None = None, ignore_name_scope: bool = False,
             process_set=None):
    """Send ``splits[i]`` rows of ``tensor`` to rank ``i``, receive every rank's rows for this one.

    Returns the received tensor, and with ``splits`` also the received splits (Horovod's
    convention). Without ``splits`` dimension 0 is split evenly.

    Raises:
        NotInitializedError; DataError/ConfigError (also InvalidArgumentError): dimension 0
        not divisible, or bad splits; CollectiveError (also FailedPreconditionError).
    """
    tf = bridge.tf_module()
    check_init("alltoall")
    ps = _ps(process_set)
    tensor = as_tensor(tensor)
    bridge.check_dtype(tensor, "alltoall", name, reduce=False)
    splits_t = None if splits is None else tf.cast(as_tensor(splits), tf.int32)
    name = _op_name("HorovodAlltoall", name, tensor)
    shapes = [bridge.static_shape(tensor.shape, False), tf.TensorShape([None])]

    def raw(x, sp, nm):
        if sp is None:
            return bridge.run(lambda y: kernels.k_alltoall(y, None, nm, ps), [x], [x.dtype, tf.int32], shapes)
        return bridge.run(lambda y, s: kernels.k_alltoall(y, s, nm, ps), [x, sp], [x.dtype, tf.int32], shapes)

    if not bridge.may_record() or not tensor.dtype.is_floating:
        out, received = raw(tensor, splits_t, name)
    else:
        @tf.custom_gradient
        def fwd(x):
            y, rec = raw(x, splits_t, name)

            def grad(dy, _drec=None):
                dy = tf.convert_to_tensor(dy)
                return raw(dy, rec, _op_name("HorovodAlltoall", None, dy))[0]

            return (y, rec), grad

        out, received = fwd(tensor)
        received = tf.stop_gradient(received)
    return out if splits is None else (out, received)


def _grouped_reducescatter(tensors: Sequence[Any], name: str | None = None, op=hn.Sum,
                           ignore_name_scope: bool = False, process_set=None, prescale_factor: float = 1.0,
                           postscale_factor: float = 1.0) -> list:
    """Reduce each tensor across ranks and give each rank its block of dimension 0.

    Blocks are as even as possible; the first ranks get one extra row.

    Raises:
        NotInitializedError; DataError (also InvalidArgumentError): a scalar or a dtype
        that cannot be reduced; CollectiveError (also FailedPreconditionError).
    """
    tf = bridge.tf_module()
    check_init("reducescatter")
    ps = _ps(process_set)
    tensors = [as_tensor(t) for t in tensors]
    if not tensors:
        return []
    for t in tensors:
        bridge.check_dtype(t, "reducescatter", name, reduce=True)
        if t.shape.rank == 0:
            raise bridge.as_tf_error(DataError("hora.tensorflow.reducescatter: a scalar cannot be scattered; "
                                               "pass a tensor with at least one dimension"))
    name = _op_name("HorovodReducescatter", name, tensors[0])

    def raw(xs):
        return bridge.run(lambda *zs: kernels.k_reducescatter(list(zs), op, prescale_factor, postscale_factor, name, ps),
                          xs, [x.dtype for x in xs], [bridge.static_shape(x.shape, False) for x in xs])

    if not bridge.may_record() or not all(t.dtype.is_floating for t in tensors):
        return raw(tensors)

    @tf.custom_gradient
    def fwd(*xs):
        ys = raw(list(xs))

        def grad(*dys):
            factor = (ps.size() if _is(op, hn.Sum) else 1) * prescale_factor * postscale_factor
            dys = [tf.zeros_like(y) if d is None else tf.convert_to_tensor(d) for d, y in zip(dys, ys)]
            return [allgather(d * tf.cast(factor, d.dtype) if factor != 1 else d, process_set=ps) for d in dys]

        return ys, grad

    return list(fwd(*tensors))


def _reducescatter(tensor: Any, name: str | None = None, op=hn.Sum, ignore_name_scope: bool = False,
                   process_set=None, prescale_factor: float = 1.0, postscale_factor: float = 1.0):
    """Reduce-scatter one tensor (Horovod's ``mpi_ops._reducescatter``); see :func:`_grouped_reducescatter`."""
    return _grouped_reducescatter([tensor], name=name, op=op, process_set=process_set,
                                  prescale_factor=prescale_factor, postscale_factor=postscale_factor)[0]


def barrier(process_set=None) -> None:
    """Block until every rank of ``process_set`` reaches the barrier (eager only).

    Raises:
        ConfigError: called while building a graph.
        CollectiveError: a rank never arrived within the backend's timeout.
    """
    if not bridge.executing_eagerly():
        raise ConfigError("hora.tensorflow.barrier must be called eagerly, not while building a graph")
    check_init("barrier")
    hn.barrier(process_set=_ps(process_set))


def join():
    """Signal that this rank has no more data; returns the last rank to join (an int32 tensor).

    Raises:
        CollectiveError: the backend failed.
    """
    check_init("join")
    return _int_op(hn.join, "join", None)


__all__ = [
    "init", "add_process_set", "remove_process_set", "size_op", "local_size_op", "rank_op", "local_rank_op",
    "process_set_included_op", "allgather", "grouped_allgather", "broadcast", "broadcast_", "alltoall",
    "barrier", "join", "check_init",
]
