"""The bridge between TensorFlow tensors and :mod:`hora.native`, eager and in graphs.

The bridge copies at most once each way:

* in: a CPU ``EagerTensor`` (or a variable's current value) is handed to the backend as
  a numpy *view* of its buffer (``EagerTensor._numpy()``, no copy). The backend's ops
  are out of place, so the tensor, which TensorFlow treats as immutable, is never written.
* out: the backend's result array becomes a tensor through DLPack without a copy when
  TensorFlow can alias it (a fresh, C-contiguous, 64-byte aligned numeric buffer), and
  through one ``tf.convert_to_tensor`` copy otherwise.

In a graph (``tf.function`` or a ``tf.compat.v1`` graph run by a session) every op is a
``tf.py_function`` whose body runs the eager path. ``tf.function`` runs stateful ops,
``py_function`` included, in program order, so ranks issue unnamed collectives in the
same order and the engine's call-order names match. A ``tf.compat.v1`` graph has no such
order (a session may run independent ops in any order), so unnamed ops there are named
after their input tensor, as Horovod names its graph ops (``HorovodAllreduce_<tensor>``).

Dtypes: data-movement ops (allgather, broadcast, alltoall) carry every TensorFlow
numeric dtype and ``bool`` (the engine moves what Gloo lacks as bytes; bfloat16, which has
no torch-readable numpy form, travels here as int16 bits and is viewed back). Reductions
take float16/32/64, bfloat16 (reduced in float32), int8/16/32/64, uint8.

Threads: a ``tf.compat.v1`` session runs each ready op on an inter-op thread, and a hora
op holds its thread while it waits for the other ranks. A session step with more
independent hora ops than inter-op threads would wait forever (each rank's threads held by
ops the other ranks have not started). So that sessions get enough threads, importing
``hora.tensorflow`` sets ``TF_NUM_INTEROP_THREADS`` to ``max(64, cpu count)`` unless it
is set already (TensorFlow reads it when it creates its thread pools, i.e. before the
first op). Eager code and ``tf.function`` run hora ops one after another and do not
depend on it; ``DistributedOptimizer``/``DistributedGradientTape`` reduce a step's
gradients in one op.

Errors raised by the backend keep their hora class and also become TensorFlow's, as
Horovod's ops raise them: a :class:`~hora.errors.CollectiveError` (ranks disagree about
shape, dtype, root, ...) is also a ``tf.errors.FailedPreconditionError``; a
``ConfigError``/``DataError`` (a bad argument) is also a ``tf.errors.InvalidArgumentError``.
Inside a graph, TensorFlow turns an exception raised by a ``py_function`` into an
``OpError`` whose message carries the hora error's class and text
(``InvalidArgumentError`` for the ValueError-based ones, ``UnknownError`` otherwise).
"""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hora.errors import CollectiveError, ConfigError, DataError

_ALIGN = 64  # TensorFlow's CPU allocator alignment (EIGEN_MAX_ALIGN_BYTES); DLPack needs it
_DLPACK_KINDS = frozenset("biufc")
_REDUCIBLE = frozenset({"float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8"})
_MOVABLE = _REDUCIBLE | {"bool", "uint16", "uint32", "uint64"}
_INTEROP_THREADS = max(64, os.cpu_count() or 1)
os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(_INTEROP_THREADS))


def tf_module():
    """The ``tensorflow`` module (imported on first use)."""
    import tensorflow as tf

    return tf


# ---------------------------------------------------------------------------------------
# tensors <-> numpy
# ---------------------------------------------------------------------------------------
def is_keras_variable(x: Any) -> bool:
    """Whether ``x`` is a Keras 3 variable (not a ``tf.Variable``, but holds one)."""
    mod = type(x).__module__
    return mod.startswith("keras") and hasattr(x, "value") and hasattr(x, "assign")


def as_tensor(x: Any):
    """A ``tf.Tensor`` for ``x`` (a tensor, tf.Variable, keras.Variable, numpy array, scalar)."""
    tf = tf_module()
    if is_keras_variable(x):
        x = x.value
    if isinstance(x, tf.Tensor):
        return x
    return tf.convert_to_tensor(x)


def to_numpy(t) -> np.ndarray:
    """A numpy view of an eager tensor's buffer (no copy on CPU; one host copy on GPU)."""
    t = as_tensor(t)
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
    tf = tf_module()
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


def check_dtype(t, op: str, name: str | None, reduce: bool) -> None:
    """Raise a clear error for a dtype the op cannot take (before anything is sent).

    Raises:
        DataError: a string/resource/variant/complex tensor, or (``reduce``) a dtype
            that cannot be reduced (bool, uint16/32/64).
    """
    allowed = _REDUCIBLE if reduce else _MOVABLE
    if t.dtype.name not in allowed:
        what = "reduced" if reduce else "communicated"
        raise DataError(
            f"hora.tensorflow.{op}: tensor {name or '(unnamed)'} has dtype {t.dtype.name}, which cannot be {what}; "
            f"use one of {', '.join(sorted(allowed))}"
            + ("" if reduce else " (or broadcast_object/allgather_object for Python objects)")
        )


def movable(arr: np.ndarray) -> np.ndarray:
    """``arr`` as an array torch can read: bfloat16 (numpy's is ml_dtypes') travels as int16 bits."""
    if arr.dtype.name != "bfloat16":
        return arr
    carry = np.dtype(np.int16)
    return arr.view(carry) if arr.ndim else arr.reshape(1).view(carry).reshape(())


def moved_back(arr: np.ndarray, like: np.dtype) -> np.ndarray:
    """The inverse of :func:`movable`: view ``arr`` as the dtype it carried."""
    arr = np.asarray(arr)
    if arr.dtype == like:
        return arr
    return arr.view(like) if arr.ndim else arr.reshape(1).view(like).reshape(())


def reducible(t):
    """bfloat16 has no numpy/DLPack form the backends reduce: compute it in float32."""
    tf = tf_module()
    return tf.cast(t, tf.float32) if t.dtype == tf.bfloat16 else t


# ---------------------------------------------------------------------------------------
# errors: hora's class, and TensorFlow's
# ---------------------------------------------------------------------------------------
_TF_ERROR_CLASSES: dict[type, type] = {}


def as_tf_error(exc: BaseException) -> BaseException:
    """``exc`` re-typed as a subclass of its own class and of the TensorFlow error Horovod raises.

    A CollectiveError also becomes a ``tf.errors.FailedPreconditionError``, a
    ConfigError/DataError a ``tf.errors.InvalidArgumentError``; anything else is
    returned unchanged.
    """
    tf = tf_module()
    if isinstance(exc, tf.errors.OpError):
        return exc
    if isinstance(exc, CollectiveError):
        tf_cls = tf.errors.FailedPreconditionError
    elif isinstance(exc, (ConfigError, DataError)):
        tf_cls = tf.errors.InvalidArgumentError
    else:
        return exc
    cls = type(exc)
    sub = _TF_ERROR_CLASSES.get(cls)
    if sub is None:
        sub = type(cls.__name__, (cls, tf_cls), {
            "__init__": _tf_error_init(tf_cls),
            "__reduce__": lambda self: (_rebuild_tf_error, (cls, self.message)),
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
        })
        _TF_ERROR_CLASSES[cls] = sub
    new = sub(str(exc))
    new.__cause__ = exc.__cause__
    return new


def _tf_error_init(tf_cls: type) -> Callable:
    def __init__(self, message: str) -> None:
        tf_cls.__init__(self, None, None, message)
        self.args = (message,)

    return __init__


def _rebuild_tf_error(cls: type, message: str) -> BaseException:
    return as_tf_error(cls(message))


def guarded(fn: Callable) -> Callable:
    """``fn`` with hora's errors re-raised as :func:`as_tf_error` makes them."""

    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except (CollectiveError, ConfigError, DataError) as exc:
            raise as_tf_error(exc).with_traceback(exc.__traceback__) from None

    return call


# ---------------------------------------------------------------------------------------
# running an eager kernel now, or as a graph op
# ---------------------------------------------------------------------------------------
def run(eager_fn: Callable, inputs: Sequence, tout: Sequence, shapes: Sequence) -> list:
    """Run ``eager_fn(*inputs) -> list of tensors`` now (eager) or as a ``tf.py_function``.

    ``shapes`` are the static shapes to restore on the graph outputs (``None``: unknown).

    Raises:
        The errors of ``eager_fn``, as :func:`as_tf_error` types them (eager), or a
        ``tf.errors.OpError`` carrying them when the graph runs.
    """
    tf = tf_module()
    fn = guarded(eager_fn)
    if tf.executing_eagerly():
        return list(fn(*inputs))
    outs = tf.py_function(func=lambda *xs: list(fn(*xs)), inp=list(inputs), Tout=list(tout))
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    outs = list(outs)
    for o, s in zip(outs, shapes):
        if s is not None:
            o.set_shape(s)
    return outs


def may_record() -> bool:
    """Whether a gradient tape could record an op now (always, when building a graph).

    Eager calls outside any ``tf.GradientTape`` skip ``tf.custom_gradient``, whose
    per-call bookkeeping costs more than a small collective.
    """
    tf = tf_module()
    if not tf.executing_eagerly():
        return True
    try:
        from tensorflow.python.eager import record
    except ImportError:  # a TensorFlow without this internal: always go through custom_gradient
        return True
    return bool(record.could_possibly_record())


def in_v1_graph() -> bool:
    """Whether ops are being added to a ``tf.compat.v1`` graph (not eager, not a tf.function)."""
    tf = tf_module()
    if tf.executing_eagerly():
        return False
    return not getattr(tf.compat.v1.get_default_graph(), "building_function", False)


_graph_names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def graph_op_name(prefix: str, name: str | None, tensor: Any) -> str | None:
    """The engine name of an op: ``name``, or in a ``tf.compat.v1`` graph Horovod's
    ``<prefix>_<input tensor name>`` (with ``_<k>`` for the k-th repeat in the graph).

    Eager and inside ``tf.function`` an unnamed op stays unnamed (the engine names it by
    call order, which program order makes equal on every rank).
    """
    if name is not None or not in_v1_graph():
        return name
    tf = tf_module()
    graph = tf.compat.v1.get_default_graph()
    base = f"{prefix}_{re.sub('[^a-zA-Z0-9_]', '_', getattr(tensor, 'name', '') or 'tensor')}"
    counts = _graph_names.setdefault(graph, {})
    k = counts.get(base, 0)
    counts[base] = k + 1
    return base if k == 0 else f"{base}_{k}"


def static_shape(shape, first_dim_known: bool):
    """``shape`` as a static shape for an op output; dimension 0 unknown unless ``first_dim_known``."""
    tf = tf_module()
    shape = tf.TensorShape(shape)
    if shape.rank is None:
        return None
    if first_dim_known or shape.rank == 0:
        return shape
    return tf.TensorShape([None] + shape.as_list()[1:])


def executing_eagerly() -> bool:
    """``tf.executing_eagerly()`` (Horovod's ``horovod.tensorflow.util._executing_eagerly``)."""
    return bool(tf_module().executing_eagerly())


__all__ = [
    "as_tensor", "as_tf_error", "check_dtype", "executing_eagerly", "from_numpy", "graph_op_name", "guarded",
    "in_v1_graph", "is_keras_variable", "may_record", "movable", "moved_back", "reducible", "run", "static_shape",
    "tf_module", "to_numpy",
]
