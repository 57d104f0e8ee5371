"""Broadcasting variables and Python objects (Horovod's ``horovod.tensorflow.functions``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import hora.native as hn
from hora.errors import ConfigError
from hora.tensorflow import bridge, mpi_ops

log = logging.getLogger(__name__)


def _dedupe(variables: Iterable[Any]) -> list:
    seen: set[int] = set()
    out = []
    for v in variables:
        key = id(v.value) if bridge.is_keras_variable(v) else id(v)
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out


def broadcast_variables(variables: Iterable[Any], root_rank: int = 0, process_set: Any = None):
    """Assign ``root_rank``'s values to ``variables`` (``tf.Variable`` or ``keras.Variable``) on every rank.

    Eager: every variable is assigned before this returns (returns ``None``). In a
    graph: returns the op that groups the assignments.

    Raises:
        NotInitializedError: before ``hora.init()``.
        ConfigError: an element is not a variable.
        CollectiveError (also FailedPreconditionError): ranks disagree about the
            variables (count, shapes, dtypes).
    """
    tf = bridge.tf_module()
    variables = _dedupe(variables)
    if not variables:
        mpi_ops.check_init("broadcast_variables")
        return None if tf.executing_eagerly() else tf.group()
    values = mpi_ops.broadcast_(variables, root_rank, process_set=process_set)
    if tf.executing_eagerly():
        return None
    return tf.group(*values)


def broadcast_global_variables(root_rank: int):
    """Broadcast every ``tf.compat.v1`` global variable from ``root_rank`` (TF1 graphs only).

    Raises:
        RuntimeError: called eagerly (Horovod's error: use ``broadcast_variables``).
    """
    tf = bridge.tf_module()
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. "
                           "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def _not_tracing(what: str) -> None:
    tf = bridge.tf_module()
    if not tf.executing_eagerly() and not bridge.in_v1_graph():
        raise ConfigError(f"hora.tensorflow.{what} works on Python objects and runs when called; call it outside "
                          "tf.function (inside it would run once, at trace time)")


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: str | None = None,
                     process_set: Any = None) -> Any:
    """Return ``root_rank``'s Python object on every rank (pickled with cloudpickle).

    Runs when called, eagerly or while a ``tf.compat.v1`` graph is built (``session`` is
    accepted for Horovod compatibility and not needed).

    Raises:
        ConfigError: called while tracing a ``tf.function``.
        NotInitializedError, CollectiveError: from the backend.
    """
    _not_tracing("broadcast_object")
    mpi_ops.check_init("broadcast_object")
    ps = mpi_ops._ps(process_set)
    return hn.broadcast_object(obj, root_rank=root_rank, name=name, process_set=ps)


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None,
                        process_set: Any = None) -> Callable[[Any], Any]:
    """A function ``f(obj)`` that returns ``root_rank``'s ``obj`` (Horovod's TF1 helper)."""

    def _bcast(obj: Any) -> Any:
        return broadcast_object(obj, root_rank=root_rank, session=session, name=name, process_set=process_set)

    return _bcast


def allgather_object(obj: Any, session: Any = None, name: str | None = None, process_set: Any = None) -> list:
    """Return the list of every rank's Python object, in rank order (runs when called).

    Raises:
        ConfigError: called while tracing a ``tf.function``.
        NotInitializedError, CollectiveError: from the backend.
    """
    _not_tracing("allgather_object")
    mpi_ops.check_init("allgather_object")
    ps = mpi_ops._ps(process_set)
    return hn.allgather_object(obj, name=name, process_set=ps)


def _hook_class() -> type:
    tf = bridge.tf_module()

    class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
        """A TF1 ``SessionRunHook`` that broadcasts every global variable from ``root_rank``
        once the session is created (Horovod's hook for ``MonitoredTrainingSession``)."""

        def __init__(self, root_rank: int, device: str = "") -> None:
            super().__init__()
            self.root_rank = root_rank
            self.device = device
            self.bcast_op = None

        def begin(self) -> None:
            if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
                self.bcast_op = broadcast_global_variables(self.root_rank)

        def after_create_session(self, session: Any, coord: Any) -> None:
            session.run(self.bcast_op)

    BroadcastGlobalVariablesHook.__qualname__ = "BroadcastGlobalVariablesHook"
    BroadcastGlobalVariablesHook.__module__ = __name__
    return BroadcastGlobalVariablesHook


def __getattr__(name: str) -> Any:
    """``BroadcastGlobalVariablesHook`` is built on first use (it subclasses a TensorFlow class).

    Raises:
        AttributeError: any other unknown name.
    """
    if name == "BroadcastGlobalVariablesHook":
        cls = _hook_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["broadcast_variables", "broadcast_global_variables", "broadcast_object", "broadcast_object_fn",
           "allgather_object"]
