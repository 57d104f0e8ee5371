"""Training state that can be committed, rolled back and re-synchronized (Horovod's
``hvd.elastic.TorchState``).

::

    state = hora.torch.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    state.sync()                      # every rank starts from rank 0's state
    for state.epoch in range(state.epoch, epochs):
        ...train...
        state.commit()                # an in-memory snapshot to roll back to
    # after a failed step (e.g. a CollectiveError) on every rank:
    state.restore()                   # back to the last commit

Snapshots live in memory (deep copies of the model's and optimizer's ``state_dict``
and of the extra attributes). What hora does not have yet is Horovod's elastic *driver*
(adding and removing hosts while a job runs, re-forming the ranks, ``hvd.elastic.run``):
hora jobs have a fixed set of ranks, so ``check_host_updates`` has nothing to check
and there is no ``run`` decorator.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import torch

from hora.errors import ConfigError
from hora.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters

log = logging.getLogger(__name__)


class State:
    """Base class: commit/restore/sync of some state, with reset callbacks."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Functions called by :meth:`on_reset` (e.g. to rescale the learning rate)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Run the reset callbacks (after the job's ranks were re-formed)."""
        for cb in self._reset_callbacks:
            cb()

    def commit(self) -> None:
        """Snapshot the current state in memory (what :meth:`restore` returns to)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Horovod raises HostsUpdatedInterrupt here when its driver added or removed
        hosts; hora jobs have a fixed set of ranks, so there is never an update."""

    def save(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement save()")

    def restore(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement restore()")

    def sync(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement sync()")


class ObjectState(State):
    """Picklable attributes (``epoch=0, batch=0, ...``) kept in sync across ranks."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._known = list(kwargs)
        for k, v in kwargs.items():
            setattr(self, k, v)
        self._saved: dict[str, Any] = {}
        self.save()

    def save(self) -> None:
        self._saved = {k: copy.deepcopy(getattr(self, k)) for k in self._known}

    def restore(self) -> None:
        for k, v in self._saved.items():
            setattr(self, k, copy.deepcopy(v))

    def sync(self) -> None:
        """Every rank takes rank 0's values (and commits them).

        Raises:
            CollectiveError: the broadcast failed.
        """
        if self._known:
            values = broadcast_object({k: getattr(self, k) for k in self._known}, root_rank=0,
                                      name="elastic.object_state")
            for k, v in values.items():
                setattr(self, k, v)
        self.save()


class TorchState(ObjectState):
    """A model, an optimizer and picklable attributes, committed and restored together.

    Args:
        model: a ``torch.nn.Module`` (or ``None``).
        optimizer: a ``torch.optim.Optimizer``, plain or a DistributedOptimizer (or ``None``).
        **kwargs: attributes such as ``epoch=0, batch=0``.

    Raises:
        ConfigError: ``model`` or ``optimizer`` has the wrong type.
    """

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs: Any) -> None:
        if model is not None and not isinstance(model, torch.nn.Module):
            raise ConfigError(f"TorchState model must be a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"TorchState optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.model = model
        self.optimizer = optimizer
        self._model_saved: dict[str, torch.Tensor] | None = None
        self._opt_saved: dict[str, Any] | None = None
        super().__init__(**kwargs)

    def save(self) -> None:
        super().save()
        if self.model is not None:
            self._model_saved = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._opt_saved = copy.deepcopy(self.optimizer.state_dict())

    def restore(self) -> None:
        """Return the model, optimizer and attributes to the last commit (in place)."""
        super().restore()
        if self.model is not None and self._model_saved is not None:
            self.model.load_state_dict(self._model_saved)
        if self.optimizer is not None and self._opt_saved is not None:
            self.optimizer.load_state_dict(copy.deepcopy(self._opt_saved))
            if hasattr(self.optimizer, "_hora_handles"):
                # a restored DistributedOptimizer starts a fresh step (nothing in flight)
                self.optimizer._hora_handles.clear()
                self.optimizer._hora_reset_counts()

    def sync(self) -> None:
        """Every rank takes rank 0's model, optimizer and attributes, then commits.

        Raises:
            NotInitializedError: hora.init() was not called.
            CollectiveError: a broadcast failed.
        """
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        super().sync()


__all__ = ["State", "ObjectState", "TorchState"]
