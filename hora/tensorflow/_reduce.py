"""The gradient reduction shared by the tape and both optimizers (``tf.compat.v1`` in
:mod:`hora.tensorflow.gradients`, Keras 3 in :mod:`hora.tensorflow.keras_optimizer`): Horovod's
``groups``, the process set's membership, the dense/sparse reduction with its predivide split, and
local sources (not reduced; scaled by the set's size). Below both: neither imports the other for it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import hora.native as hn
from hora.tensorflow import bridge, collectives


def _split_list(items: list, n: int) -> list:
    d, r = divmod(len(items), n)
    return [items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(n)]


def check_groups(groups: Any, num_groups: int) -> Any:
    """Horovod's ``groups``/deprecated ``num_groups`` pair, validated.

    Raises:
        ValueError: ``groups`` is neither a positive int nor a list of lists of variables.
    """
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of tf.Variable.")
    return groups


def source_key(v: Any) -> Any:
    """A hashable key for a variable/tensor source (Keras 3 variables have no ``ref()``)."""
    ref = getattr(v, "ref", None)
    return ref() if callable(ref) else ("id", id(v))


def included(process_set: Any) -> bool:
    """Whether this rank takes part in reducing over ``process_set``."""
    ps = hn.global_process_set if process_set is None else process_set
    if ps is hn.global_process_set:
        return True
    return bool(ps.included())


def reduce_gradients(grads: Sequence[Any], variables: Sequence[Any] | None = None, *, op: Any = None,
                     compression: Any = None, sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                     groups: Any = None, process_set: Any = None, name: str | None = None,
                     use_generic_names: bool = False) -> list:
    """Reduce a list of gradients across ranks (``None`` entries stay ``None``).

    ``variables`` (aligned with ``grads``) are needed only for ``groups`` given as lists
    of variables.

    Raises:
        ValueError: ``gradient_predivide_factor`` with an op other than Average.
        NotImplementedError, DataError, CollectiveError: from :func:`hora.tensorflow.grouped_allreduce`.
    """
    tf = bridge.tf_module()
    op = hn.Average if op is None else op
    if gradient_predivide_factor != 1.0 and op != hn.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    pre, post = ((1.0 / gradient_predivide_factor, gradient_predivide_factor) if op == hn.Average
                 else (1.0, 1.0))
    grads = list(grads)
    if not included(process_set):
        return grads
    if sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    present = [i for i, g in enumerate(grads) if g is not None]
    if isinstance(groups, list):
        by_name = {variables[i].name: i for i in present}
        index_groups = []
        for group in groups:
            idx = [by_name.pop(v.name) for v in group if v.name in by_name]
            if idx:
                index_groups.append(idx)
        index_groups += [[i] for i in by_name.values()]
    elif groups:
        index_groups = [g for g in _split_list(present, groups) if g]
    else:
        index_groups = [present] if present else []
    out = list(grads)
    for k, idx in enumerate(index_groups):
        group_name = f"grad_{k}" if use_generic_names else (None if name is None else f"{name}.{k}")
        reduced = collectives.grouped_allreduce([grads[i] for i in idx], op=op, compression=compression,
                                                prescale_factor=pre, postscale_factor=post,
                                                process_set=process_set, name=group_name)
        for i, r in zip(idx, reduced):
            out[i] = r
    return out


def _scale_local(grad: Any, size: int) -> Any:
    tf = bridge.tf_module()
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / float(size), grad.indices, grad.dense_shape)
    return grad / tf.cast(float(size), grad.dtype)


def reduce_except_local(grads: Sequence[Any], sources: Sequence[Any], local_keys: set, scale_local: bool,
                        process_set: Any, **reduce_kwargs: Any) -> list:
    """:func:`reduce_gradients` on the gradients of non-local sources; local ones kept (scaled by 1/size)."""
    grads = list(grads)
    global_idx = [i for i, s in enumerate(sources) if source_key(s) not in local_keys]
    reduced = reduce_gradients([grads[i] for i in global_idx], [sources[i] for i in global_idx],
                               process_set=process_set, **reduce_kwargs)
    out = list(grads)
    for i, r in zip(global_idx, reduced):
        out[i] = r
    if scale_local and len(global_idx) < len(grads):
        size = (hn.global_process_set if process_set is None else process_set).size()
        for i, (s, g) in enumerate(zip(sources, grads)):
            if source_key(s) in local_keys and g is not None:
                out[i] = _scale_local(g, size)
    return out


__all__ = ["check_groups", "source_key", "included", "reduce_gradients", "reduce_except_local"]
