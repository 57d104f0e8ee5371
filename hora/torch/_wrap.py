"""Wrapping an optimizer instance in a dynamic subclass that shares its state.

Both DistributedOptimizers (averaging and Adasum) are instances of a class made on the
fly, ``type(name, (Mixin, optimizer.__class__), ...)``, whose ``__dict__`` is the wrapped
optimizer's: ``param_groups`` and ``state`` are the same objects, so ``isinstance``,
``state_dict()`` and LR schedulers keep working.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch


def wrap_instance(optimizer: torch.optim.Optimizer, mixin: type) -> Any:
    """A new instance of ``(mixin, type(optimizer))`` sharing ``optimizer``'s state.

    Everything in ``optimizer.__dict__`` is shared but an instance ``step``: an LR
    scheduler made before wrapping (as Lightning always does) replaced the optimizer's
    step by a counting wrapper bound to the raw optimizer; copying it would make
    ``dist.step()`` step the raw optimizer and skip the mixin (no synchronize). The
    wrapper gets a counting ``step`` of its own instead (:func:`_count_steps`).
    """
    base = optimizer.__class__
    cls = type(base.__name__, (mixin, base), {"__module__": base.__module__, "__qualname__": base.__qualname__})
    dist = cls.__new__(cls)
    counted = optimizer.__dict__.get("step")
    dist.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k != "step"})
    if getattr(counted, "_wrapped_by_lr_sched", False):
        _count_steps(dist, optimizer)
    return dist


def _count_steps(dist: torch.optim.Optimizer, raw: torch.optim.Optimizer) -> None:
    """Mark ``dist.step`` as a torch LR scheduler marks its optimizer's, and tell both a
    scheduler of ``raw`` (made before wrapping) and one of ``dist`` that a step happened,
    so neither warns that ``scheduler.step()`` came first. Such a scheduler still adjusts
    the learning rates (``raw`` and ``dist`` share their param groups) until a
    ``dist.load_state_dict()`` gives ``dist`` new ones: point it at the wrapper
    (``scheduler.optimizer = dist``), or make schedulers after wrapping."""
    dist_ref, raw_ref = weakref.ref(dist), weakref.ref(raw)
    step = type(dist).step

    @functools.wraps(step)
    def counted(*args: Any, **kwargs: Any) -> Any:
        opt, orig = dist_ref(), raw_ref()
        if orig is not None:
            orig._opt_called = True  # type: ignore[attr-defined]
        opt._opt_called = True  # type: ignore[union-attr]
        return step(opt, *args, **kwargs)

    counted._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    dist.step = counted  # type: ignore[method-assign]
