"""Variable broadcasting and gradient reduction for TensorFlow training loops."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import hora.native as hn
from hora.errors import ConfigError
from hora.tensorflow import mpi_ops

log = logging.getLogger(__name__)


def _tf():
    import tensorflow as tf

    return tf


def _dedupe(variables: Iterable[Any]) -> list:
    seen: set[int] = set()
    out = []
    for v in variables:
        key = id(v.value) if mpi_ops._is_keras_variable(v) else id(v)
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out


def broadcast_variables(variables: Iterable[Any], root_rank: int = 0, process_set=None):
    """Assign ``root_rank``'s values to ``variables`` (``tf.Variable`` or ``keras.Variable``) on every rank.

    Eager: the broadcasts run asynchronously and every variable is assigned before this
    returns. Inside ``tf.function``: one ``py_function`` broadcasts all values, and the
    returned op groups the assignments.

    Raises:
        NotInitializedError: before ``hora.init()``.
        ConfigError: an element is not a variable.
        CollectiveError: ranks disagree about the variables (count, shapes, dtypes).
    """
    tf = _tf()
    variables = _dedupe(variables)
    for i, v in enumerate(variables):
        if not (isinstance(v, tf.Variable) or mpi_ops._is_keras_variable(v)):
            raise ConfigError(
                f"broadcast_variables: element {i} is a {type(v).__name__}, not a tf.Variable or keras.Variable"
            )
    mpi_ops._check_init("broadcast_variables")
    process_set = hn.global_process_set if process_set is None else process_set
    if not variables:
        return None
    values = [mpi_ops._as_tensor(v) for v in variables]

    def eager(*xs):
        arrays = [mpi_ops.to_numpy(mpi_ops._wide(x)) for x in xs]
        if hasattr(hn, "broadcast_async"):
            handles = [hn.broadcast_async(a, root_rank, process_set=process_set) for a in arrays]
            outs = [hn.synchronize(h) for h in handles]
        else:
            outs = [hn.broadcast(a, root_rank, process_set=process_set) for a in arrays]
        return [mpi_ops.from_numpy(o, x.dtype) for o, x in zip(outs, xs)]

    new_values = mpi_ops._run(eager, values, [x.dtype for x in values], [x.shape for x in values])
    assigns = [v.assign(nv) for v, nv in zip(variables, new_values)]
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assigns if a is not None])


def broadcast_(variables: Iterable[Any], root_rank: int = 0, process_set=None):
    """In-place broadcast of variables; an alias of :func:`broadcast_variables`."""
    return broadcast_variables(variables, root_rank, process_set=process_set)


def _reduce_gradients(
    grads: Sequence[Any],
    *,
    op,
    compression,
    sparse_as_dense: bool,
    gradient_predivide_factor: float,
    process_set,
    name_prefix: str | None = None,
) -> list:
    """Allreduce a list of gradients (``None`` entries stay ``None``); dense ones in one group."""
    tf = _tf()
    process_set = hn.global_process_set if process_set is None else process_set
    op = hn.Average if op is None else op
    if gradient_predivide_factor != 1.0:
        if op != hn.Average:
            raise ConfigError("gradient_predivide_factor needs op=Average")
        prescale = 1.0 / gradient_predivide_factor
        postscale = gradient_predivide_factor / mpi_ops._set_size(process_set)
        dense_op = hn.Sum
    else:
        prescale = postscale = 1.0
        dense_op = op
    out: list[Any] = list(grads)
    dense_idx, dense = [], []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if sparse_as_dense:
                g = tf.convert_to_tensor(g)
            else:
                name = None if name_prefix is None else f"{name_prefix}.{i}"
                out[i] = mpi_ops.allreduce(g, op=op, name=name, process_set=process_set)
                continue
        dense_idx.append(i)
        dense.append(g)
    if dense:
        reduced = mpi_ops.grouped_allreduce(
            dense, op=dense_op, name=name_prefix, prescale_factor=prescale, postscale_factor=postscale,
            process_set=process_set, compression=compression,
        )
        for i, r in zip(dense_idx, reduced):
            out[i] = r
    return out


def _in_set(process_set) -> bool:
    """Whether this rank belongs to ``process_set`` (gradients of non-members are left local)."""
    if process_set is None or process_set is hn.global_process_set:
        return True
    included = getattr(process_set, "included", None)
    if callable(included):
        return bool(included())
    ranks = getattr(process_set, "ranks", None)
    return ranks is None or hn.rank() in list(ranks)


class _DistributedGradientTapeMixin:
    """Methods grafted onto a copy of the user's tape (see :func:`DistributedGradientTape`)."""

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = super().gradient(target, sources, output_gradients, **kwargs)
        if not _in_set(self._hora_process_set):
            return grads
        tf = _tf()
        flat = tf.nest.flatten(grads)
        reduced = _reduce_gradients(
            flat, op=self._hora_op, compression=self._hora_compression,
            sparse_as_dense=self._hora_sparse_as_dense,
            gradient_predivide_factor=self._hora_predivide, process_set=self._hora_process_set,
        )
        return tf.nest.pack_sequence_as(grads, reduced)


def DistributedGradientTape(
    gradtape,
    compression=None,
    sparse_as_dense: bool = False,
    op=None,
    gradient_predivide_factor: float = 1.0,
    process_set=None,
    device_dense: str = "",
    device_sparse: str = "",
):
    """Wrap a ``tf.GradientTape`` so ``gradient()`` returns gradients averaged across ranks.

    Returns a tape of a subclass of ``type(gradtape)`` that shares the recorded state of
    ``gradtape``; it can wrap a tape after its ``with`` block (Horovod's usage) or before.
    Dense gradients are reduced in one grouped allreduce; ``IndexedSlices`` by allgather
    of values and indices, or densified first with ``sparse_as_dense=True``. ``None``
    gradients stay ``None`` (every rank must agree on which are ``None``).
    ``device_dense``/``device_sparse`` are accepted for Horovod compatibility and unused
    (the backend picks the device).

    Raises:
        ConfigError: ``gradtape`` is not a ``tf.GradientTape``, or
            ``gradient_predivide_factor`` is used with an op other than ``Average``.
    """
    tf = _tf()
    if not isinstance(gradtape, tf.GradientTape):
        raise ConfigError(f"DistributedGradientTape wraps a tf.GradientTape, got {type(gradtape).__name__}")
    op = hn.Average if op is None else op
    if gradient_predivide_factor != 1.0 and op != hn.Average:
        raise ConfigError("DistributedGradientTape: gradient_predivide_factor needs op=Average")
    base = type(gradtape)
    if isinstance(gradtape, _DistributedGradientTapeMixin):
        raise ConfigError("DistributedGradientTape: this tape is already distributed")
    cls = type(base.__name__, (_DistributedGradientTapeMixin, base), {"__module__": __name__})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._hora_op = op
    tape._hora_compression = compression
    tape._hora_sparse_as_dense = bool(sparse_as_dense)
    tape._hora_predivide = float(gradient_predivide_factor)
    tape._hora_process_set = hn.global_process_set if process_set is None else process_set
    return tape


def DistributedOptimizer(optimizer, *args: Any, **kwargs: Any):
    """Horovod's ``hvd.DistributedOptimizer`` for TensorFlow: wraps a Keras 3 optimizer.

    Delegates to :func:`hora.keras.DistributedOptimizer` (see there for the arguments).

    Raises:
        ConfigError: ``optimizer`` is a Keras 2 / ``tf_keras`` / ``tf.compat.v1`` optimizer.
    """
    from hora.keras.optimizer import DistributedOptimizer as _keras_distributed

    return _keras_distributed(optimizer, *args, **kwargs)


__all__ = ["broadcast_variables", "broadcast_", "DistributedGradientTape", "DistributedOptimizer"]
