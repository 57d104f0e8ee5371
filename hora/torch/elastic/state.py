"""``TorchState``: a model, optimizers, samplers and picklable attributes, committed,
restored and synchronized together (Horovod's ``hvd.elastic.TorchState``).

::

    state = hora.torch.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    state.sync()                      # every rank starts from rank 0's state
    ...train...
    state.commit()                    # an in-memory snapshot to roll back to
    state.restore()                   # back to the last commit (after a failed step)

Every keyword argument becomes an attribute. A ``torch.nn.Module``, a
``torch.optim.Optimizer`` (plain or a DistributedOptimizer) or an
:class:`~hora.torch.elastic.sampler.ElasticSampler` is kept by a handler that snapshots
its ``state_dict`` (deep copies, in memory) and synchronizes it with broadcasts from rank
0; anything else is a picklable object broadcast as such. Assigning a new model or
optimizer to the attribute (``state.model = m``) snapshots the new one.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

import hora.native as _hn
from hora.native.elastic import ObjectState, State
from hora.torch.elastic.sampler import ElasticSampler
from hora.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters


class StateHandler:
    """Keeps one value of a :class:`TorchState` (save, restore, sync)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.save()

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()


class ModelStateHandler(StateHandler):
    """A ``torch.nn.Module``: its ``state_dict`` (parameters and buffers)."""

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(StateHandler):
    """A ``torch.optim.Optimizer``: its ``state_dict``; a restored DistributedOptimizer
    starts a fresh step (no reduction in flight)."""

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self._saved))
        reset = getattr(self.value, "_hora_forget_step", None)
        if reset is not None:
            reset()

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(StateHandler):
    """An :class:`ElasticSampler`: its epoch and how many samples were processed."""

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0,
                                                    name="elastic.sampler_state"))


_handler_registry: list[tuple[type, type[StateHandler]]] = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> list[tuple[type, type[StateHandler]]]:
    """The (type, handler class) pairs :class:`TorchState` picks handlers from, first match wins."""
    return _handler_registry


def set_handler_registry(registry: list[tuple[type, type[StateHandler]]]) -> None:
    """Replace the handler registry (Horovod's extension point)."""
    global _handler_registry
    _handler_registry = list(registry)


def _handler_for(value: Any) -> StateHandler | None:
    for kind, handler in _handler_registry:
        if isinstance(value, kind):
            return handler(value)
    return None


def _bcast(obj: Any) -> Any:
    return broadcast_object(obj, root_rank=0, name="elastic.object_state")


class TorchState(ObjectState):
    """The state of a torch training loop (module docstring).

    Args:
        model: a ``torch.nn.Module`` or ``None``.
        optimizer: a ``torch.optim.Optimizer`` or ``None``.
        **kwargs: more attributes: models, optimizers, samplers or picklable values.
    """

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers: dict[str, StateHandler] = {}
        plain: dict[str, Any] = {}
        for k, v in kwargs.items():
            h = _handler_for(v)
            if h is not None:
                handlers[k] = h
            else:
                plain[k] = v
        object.__setattr__(self, "_handlers", handlers)
        for k, h in handlers.items():
            object.__setattr__(self, k, h.value)
        super().__init__(bcast_object=_bcast, get_rank=_hn.rank, **plain)

    def save(self) -> None:
        for h in self._handlers.values():
            h.save()
        super().save()

    def restore(self) -> None:
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def reset(self) -> None:
        """After a reset (the job may have other ranks now): a DistributedOptimizer rebuilds
        what it had sized for the old job, and each :class:`ElasticSampler` splits what its
        epoch has left among the ranks there are now (a reset without a sync, after hosts
        were only removed, would leave it partitioned for the old size)."""
        for h in self._handlers.values():
            if isinstance(h, SamplerStateHandler):
                h.value.reset()
            elif isinstance(h, OptimizerStateHandler):
                forget = getattr(h.value, "_hora_forget_world", None)
                if forget is not None:
                    forget()

    def sync(self) -> None:
        """Every rank takes rank 0's models, optimizers, samplers and attributes, then saves.

        Raises:
            NotInitializedError: hora.init() was not called.
            CollectiveError: a broadcast failed.
        """
        for h in self._handlers.values():
            h.sync()
        super().sync()
        for h in self._handlers.values():
            h.save()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)


__all__ = ["State", "ObjectState", "TorchState", "StateHandler", "ModelStateHandler", "OptimizerStateHandler",
           "SamplerStateHandler", "get_handler_registry", "set_handler_registry"]
