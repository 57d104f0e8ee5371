"""Horovod's reductions on TensorFlow tensors and ``tf.IndexedSlices``: ``allreduce``,
``grouped_allreduce``, ``reducescatter``, ``grouped_reducescatter``.

A ``tf.IndexedSlices`` (a sparse gradient, e.g. of an embedding) is reduced as Horovod
reduces it: its values and indices are allgathered (values divided by the set's size
for ``Average``), so the result is an ``IndexedSlices`` holding every rank's rows
(duplicates are summed when it is densified). Only ``Sum`` and ``Average`` apply, and no
scale factors. ``dense_shape`` may be missing.

``op=None`` means ``Average``; the deprecated ``average=True/False`` still works and
warns, as in Horovod. ``Adasum`` goes to the engine's Adasum reduction.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import hora.native as hn
from hora.errors import ConfigError
from hora.tensorflow import bridge, mpi_ops
from hora.tensorflow.compression import split as split_compression


class _AdasumUnavailable:
    """``hvd.Adasum`` while the engine has no Adasum reduction: using it raises NotImplementedError."""

    name = "Adasum"

    def __repr__(self) -> str:
        return "hora.Adasum"


def _engine_adasum() -> Any:
    from hora.native.backends.base import ReduceOp

    return getattr(ReduceOp, "Adasum", None)


Adasum: Any = _engine_adasum() or _AdasumUnavailable()


def _is_adasum(op: Any) -> bool:
    return op is Adasum or getattr(op, "name", None) == "Adasum"


def handle_average_backwards_compatibility(op: Any, average: Any, _stacklevel: int = 2) -> Any:
    """``op`` from Horovod's ``op=``/deprecated ``average=`` pair (``None``, ``None``: Average).

    Raises:
        ValueError: both are given (Horovod's message).
        ConfigError: ``average`` is a reduce op (``allreduce(t, hvd.Sum)`` in the
            positional order of Horovod, whose second parameter is ``average``).
    """
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        if isinstance(average, hn.ReduceOp) or _is_adasum(average):
            raise ConfigError(f"allreduce: {average!r} was passed as `average` (the second positional parameter, as "
                              f"in Horovod); pass it as op={average!r}")
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning, stacklevel=_stacklevel + 1)
        return hn.Average if average else hn.Sum
    return hn.Average


def _sparse_op_check(op: Any, prescale_factor: float, postscale_factor: float) -> None:
    if _is_adasum(op):
        raise NotImplementedError("The Adasum reduction does not currently support sparse tensors. As a "
                                  "workaround please pass sparse_as_dense=True to DistributedOptimizer")
    if not (mpi_ops._is(op, hn.Sum) or mpi_ops._is(op, hn.Average)):
        raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")


def _dense_op(op: Any) -> Any:
    if isinstance(op, _AdasumUnavailable):
        raise NotImplementedError("hora.tensorflow: op=Adasum needs the engine's Adasum reduction "
                                  "(hora.native.ReduceOp.Adasum), which this hora build does not have yet")
    return op


def _reduce_sparse(slices: Sequence[Any], op: Any, process_set: Any) -> list:
    tf = bridge.tf_module()
    values = mpi_ops.grouped_allgather([s.values for s in slices], process_set=process_set)
    indices = mpi_ops.grouped_allgather([s.indices for s in slices], process_set=process_set)
    out = []
    for s, v, i in zip(slices, values, indices):
        if mpi_ops._is(op, hn.Average):
            v = v / tf.cast(mpi_ops._ps(process_set).size(), v.dtype)
        out.append(tf.IndexedSlices(v, i, dense_shape=s.dense_shape))
    return out


def _reduce_dense(tensors: list, op: Any, prescale_factor: float, postscale_factor: float, name: str | None,
                  process_set: Any, compression: Any) -> list:
    engine_comp, tf_comp = split_compression(compression)
    if tf_comp is None:
        return mpi_ops._grouped_allreduce(tensors, name=name, op=op, prescale_factor=prescale_factor,
                                          postscale_factor=postscale_factor, process_set=process_set,
                                          compression=engine_comp)
    compressed, ctxs = zip(*[tf_comp.compress(bridge.as_tensor(t)) for t in tensors])
    reduced = mpi_ops._grouped_allreduce(list(compressed), name=name, op=op, prescale_factor=prescale_factor,
                                         postscale_factor=postscale_factor, process_set=process_set)
    return [tf_comp.decompress(r, c) for r, c in zip(reduced, ctxs)]


def grouped_allreduce(tensors: Sequence[Any], average: Any = None, device_dense: str = "",
                      device_sparse: str = "", compression: Any = None, op: Any = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
                      ignore_name_scope: bool = False, name: str | None = None) -> list:
    """Reduce a list of tensors and ``IndexedSlices`` (dense ones fused); returns a list.

    Differentiable for ``Sum``/``Average`` (the gradient is the same allreduce of the
    upstream gradients). ``device_dense``/``device_sparse``/``ignore_name_scope`` are
    accepted for Horovod compatibility (the engine picks the device).

    Raises:
        NotInitializedError: before ``hora.init()``.
        NotImplementedError: ``IndexedSlices`` with an op other than Sum/Average, Adasum,
            or scale factors; Adasum without the engine's Adasum.
        DataError: a dtype that cannot be reduced.
        CollectiveError (also ``tf.errors.FailedPreconditionError``): ranks disagree
            about a tensor.
    """
    tf = bridge.tf_module()
    op = handle_average_backwards_compatibility(op, average, _stacklevel=2)
    tensors = list(tensors)
    if not tensors:
        return tensors
    sparse_idx = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense_idx = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if sparse_idx:
        _sparse_op_check(op, prescale_factor, postscale_factor)
    out: list[Any] = [None] * len(tensors)
    if sparse_idx:
        for i, r in zip(sparse_idx, _reduce_sparse([tensors[i] for i in sparse_idx], op, process_set)):
            out[i] = r
    if dense_idx:
        reduced = _reduce_dense([tensors[i] for i in dense_idx], _dense_op(op), prescale_factor, postscale_factor,
                                name, process_set, compression)
        for i, r in zip(dense_idx, reduced):
            out[i] = r
    return out


def allreduce(tensor: Any, average: Any = None, device_dense: str = "", device_sparse: str = "",
              compression: Any = None, op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              name: str | None = None, process_set: Any = None, ignore_name_scope: bool = False):
    """Reduce ``tensor`` (a tensor, variable or ``tf.IndexedSlices``) across the ranks of ``process_set``.

    ``op`` is Average (default, also for ``op=None``), Sum, Min, Max, Product or Adasum;
    ``average`` is Horovod's deprecated spelling of ``op=Average``/``Sum`` (it warns).
    A variable's value is reduced; the variable is not changed. See
    :func:`grouped_allreduce` for ``IndexedSlices``, gradients and errors.
    """
    op = handle_average_backwards_compatibility(op, average, _stacklevel=2)
    return grouped_allreduce([tensor], compression=compression, op=op,
                             prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                             process_set=process_set, name=name)[0]


def _compressed_reducescatter(tensors: list, compression: Any, run) -> list:
    engine_comp, tf_comp = split_compression(compression)
    if engine_comp is not None:  # the engine's reducescatter has no compression: cast here
        from hora.tensorflow.compression import BF16Compressor, FP16Compressor

        tf_comp = BF16Compressor if engine_comp == "bf16" else FP16Compressor
    if tf_comp is None:
        return run(tensors)
    compressed, ctxs = zip(*[tf_comp.compress(bridge.as_tensor(t)) for t in tensors])
    return [tf_comp.decompress(r, c) for r, c in zip(run(list(compressed)), ctxs)]


def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "", compression: Any = None,
                          op: Any = None, process_set: Any = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list:
    """Reduce each tensor across ranks and give each rank its block of dimension 0 (``op``: Average by default).

    Differentiable (Horovod's gradient: the allgather of the upstream gradient, times
    the set's size for Sum, times the scale factors).

    Raises:
        NotInitializedError; DataError (also InvalidArgumentError): a scalar, or a dtype
        that cannot be reduced; CollectiveError (also FailedPreconditionError).
    """
    op = hn.Average if op is None else _dense_op(op)
    tensors = list(tensors)
    if not tensors:
        return tensors
    return _compressed_reducescatter(
        tensors, compression,
        lambda ts: mpi_ops._grouped_reducescatter(ts, op=op, process_set=process_set,
                                                  prescale_factor=prescale_factor, postscale_factor=postscale_factor))


def reducescatter(tensor: Any, device_dense: str = "", compression: Any = None, op: Any = None,
                  name: str | None = None, process_set: Any = None, ignore_name_scope: bool = False,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0):
    """Reduce ``tensor`` across ranks and return this rank's block of dimension 0; see :func:`grouped_reducescatter`."""
    op = hn.Average if op is None else _dense_op(op)
    return _compressed_reducescatter(
        [tensor], compression,
        lambda ts: mpi_ops._grouped_reducescatter(ts, name=name, op=op, process_set=process_set,
                                                  prescale_factor=prescale_factor,
                                                  postscale_factor=postscale_factor))[0]


__all__ = ["Adasum", "allreduce", "grouped_allreduce", "reducescatter", "grouped_reducescatter",
           "handle_average_backwards_compatibility"]
