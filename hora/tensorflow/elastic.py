"""Elastic training state for TensorFlow (Horovod's ``horovod.tensorflow.elastic``).

::

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...                      # steps; a failed collective raises HorovodInternalError
            state.commit()

    train(state)

:func:`run` syncs the state from rank 0, calls the function, and when a collective
fails (``HorovodInternalError``, hora's ``CollectiveError``, also when it surfaces as a
TensorFlow ``OpError`` from inside a graph) restores the last commit, re-initializes
hora (``shutdown()``; ``init()``) and calls it again (:mod:`hora.native.elastic`'s loop,
with its ``HORA_ELASTIC_RESET_LIMIT``). hora jobs have a fixed set of ranks
(``hora run -np N``): re-initializing forms the same ranks again.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import hora.native as hn
from hora.errors import ConfigError, HorovodInternalError
from hora.native.elastic import ObjectState, State, run_fn
from hora.tensorflow import bridge, functions, mpi_ops

log = logging.getLogger(__name__)


def _internal_errors(func: Callable) -> Callable:
    """``func`` with a TensorFlow ``OpError`` that carries a CollectiveError (a collective that
    failed inside a graph: ``tf.function``, ``model.fit``) raised as HorovodInternalError, as
    Horovod's TensorFlow ``run`` does, so the retry loop sees it."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tf = bridge.tf_module()
        try:
            return func(*args, **kwargs)
        except tf.errors.OpError as exc:
            if isinstance(exc, HorovodInternalError) or "CollectiveError" not in (exc.message or ""):
                raise
            raise HorovodInternalError(exc.message) from exc

    return wrapper


def _reset() -> None:
    hn.shutdown()
    mpi_ops.init()


def run(func: Callable) -> Callable:
    """Decorator: run ``func(state, ...)`` elastically (see the module docstring; the loop is
    :func:`hora.native.elastic.run_fn`, shared by every framework)."""
    return run_fn(_internal_errors(func), _reset)


def _bcast_object(obj: Any) -> Any:
    return functions.broadcast_object(obj, root_rank=0)


def _variables(obj: Any) -> list:
    if obj is None:
        return []
    v = obj.variables
    return list(v() if callable(v) else v)


class TensorFlowKerasState(ObjectState):
    """A Keras model, its optimizer and picklable attributes, committed and restored together.

    Args:
        model: a built Keras model.
        optimizer: its optimizer (default: ``model.optimizer``).
        backend: accepted for Horovod compatibility (TF1 sessions); unused.
        **kwargs: attributes such as ``epoch=0, batch=0``.

    Raises:
        ValueError: the model is not built (Horovod's message).
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any) -> None:
        if hasattr(model, "build") and not getattr(model, "built", True):
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self.backend = backend
        self._saved_model: list = []
        self._saved_optimizer: list = []
        self._save_variables()
        super().__init__(bcast_object=_bcast_object, get_rank=hn.rank, **kwargs)

    def _save_variables(self) -> None:
        self._saved_model = [bridge.tf_module().identity(bridge.as_tensor(v)) for v in _variables(self.model)]
        self._saved_optimizer = [bridge.tf_module().identity(bridge.as_tensor(v)) for v in _variables(self.optimizer)]

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        """Return the model, optimizer and attributes to the last commit (in place)."""
        for var, value in zip(_variables(self.model), self._saved_model):
            var.assign(value)
        opt_vars = _variables(self.optimizer)
        if len(opt_vars) == len(self._saved_optimizer):  # an optimizer built after the commit keeps its state
            for var, value in zip(opt_vars, self._saved_optimizer):
                var.assign(value)
        super().restore()

    def sync(self) -> None:
        """Every rank takes rank 0's model, optimizer and attributes, then commits.

        Raises:
            NotInitializedError, CollectiveError: from the broadcasts.
        """
        functions.broadcast_variables(_variables(self.model), root_rank=0)
        opt_vars = _variables(self.optimizer)
        if opt_vars:
            functions.broadcast_variables(opt_vars, root_rank=0)
        self._save_variables()
        super().sync()


class TensorFlowState(ObjectState):
    """A list of TensorFlow variables and picklable attributes, committed and restored together (eager).

    Args:
        variables: the ``tf.Variable`` objects to track.
        session: accepted for Horovod compatibility (TF1 sessions); unused.
        **kwargs: attributes such as ``epoch=0, batch=0``.

    Raises:
        ConfigError: no variables given, or not in eager mode (TF1 global variables are
            not tracked).
    """

    def __init__(self, variables: list | None = None, session: Any = None, **kwargs: Any) -> None:
        if not bridge.executing_eagerly():
            raise ConfigError("TensorFlowState needs eager execution (TensorFlow 2); TF1 sessions are not supported")
        if not variables:
            raise ConfigError("TensorFlowState: pass the variables to track (tf.global_variables() is TF1-only)")
        self.variables = list(variables)
        self.session = session
        self._values: list = []
        self._save_variables()
        super().__init__(bcast_object=_bcast_object, get_rank=hn.rank, **kwargs)

    def _save_variables(self) -> None:
        self._values = [bridge.tf_module().identity(bridge.as_tensor(v)) for v in self.variables]

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        """Return the variables and attributes to the last commit (in place)."""
        for var, value in zip(self.variables, self._values):
            var.assign(value)
        super().restore()

    def sync(self) -> None:
        """Every rank takes rank 0's variables and attributes, then commits.

        Raises:
            NotInitializedError, CollectiveError: from the broadcasts.
        """
        functions.broadcast_variables(self.variables, root_rank=0)
        self._save_variables()
        super().sync()


__all__ = ["TensorFlowKerasState", "TensorFlowState", "run", "State", "ObjectState"]
