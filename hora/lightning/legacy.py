"""Lightning 1.x hooks that Horovod users' modules and callbacks still define, run on Lightning 2.

Horovod's Lightning estimator ran Lightning 1.x. Lightning 2.0 removed some hooks: it
refuses a module that defines ``training_epoch_end`` / ``validation_epoch_end`` /
``test_epoch_end``, and silently never calls a callback's ``on_init_start``,
``on_init_end``, ``on_epoch_start``, ``on_epoch_end``, ``on_batch_start`` and
``on_batch_end``. Horovod's own example (``pytorch_lightning_spark_mnist.py``) uses
both kinds. :class:`LegacyHooks` runs them the way 1.x did, for the duration of one fit:

* ``<stage>_epoch_end(outputs)`` receives the list of what ``<stage>_step`` returned in
  the epoch (``None`` results left out; a tensor from ``training_step`` as
  ``{"loss": tensor}``; one list per dataloader when there are several), called just
  before ``on_<stage>_epoch_end``. The module's class is swapped for a subclass that
  collects the outputs, and swapped back afterwards.
* a callback's ``on_epoch_start`` / ``on_epoch_end`` run after each train, validation
  and test epoch's start / end hooks, ``on_batch_start`` / ``on_batch_end`` around each
  training batch, ``on_init_start`` / ``on_init_end`` once the Trainer is built.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from hora.lightning._compat import Flavor

log = logging.getLogger(__name__)

#: removed module hook -> (the step whose outputs it receives, the 2.x hook it runs before)
_MODULE_HOOKS = {
    "training_epoch_end": ("training_step", "on_train_epoch_end"),
    "validation_epoch_end": ("validation_step", "on_validation_epoch_end"),
    "test_epoch_end": ("test_step", "on_test_epoch_end"),
}
_CALLBACK_HOOKS = ("on_init_start", "on_init_end", "on_epoch_start", "on_epoch_end", "on_batch_start", "on_batch_end")
#: removed 1.x hooks hora does not run
_NOT_RUN = ("training_step_end", "validation_step_end", "test_step_end", "on_pretrain_routine_start",
            "on_pretrain_routine_end", "on_keyboard_interrupt", "on_configure_sharded_model",
            "on_before_accelerator_backend_setup")


def _defines(obj: Any, name: str) -> bool:
    return callable(getattr(obj, name, None))


def describe_legacy_hooks(module: Any, callbacks: Sequence[Any]) -> list[str]:
    """One line per Lightning 1.x hook found on ``module`` or ``callbacks``: run, or not run."""
    lines = []
    name = type(module).__name__
    for hook in _MODULE_HOOKS:
        if _defines(module, hook):
            lines.append(f"{name}.{hook} was removed in Lightning 2.0; hora runs it before "
                         f"{_MODULE_HOOKS[hook][1]} as Lightning 1.x did")
    for obj, label in [(module, name)] + [(cb, type(cb).__name__) for cb in callbacks]:
        for hook in _NOT_RUN:
            if _defines(obj, hook):
                lines.append(f"{label}.{hook} was removed in Lightning 2.0 and is not called")
    for cb in callbacks:
        for hook in _CALLBACK_HOOKS:
            if _defines(cb, hook):
                lines.append(f"{type(cb).__name__}.{hook} was removed in Lightning 2.0; hora calls it as Lightning "
                             "1.x did")
    return lines


def _as_output(out: Any, training: bool) -> Any:
    if training and isinstance(out, torch.Tensor):
        return {"loss": out.detach()}
    if isinstance(out, dict):
        return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
    return out.detach() if isinstance(out, torch.Tensor) else out


def _collecting_step(step: Any, hook: str) -> Any:
    training = hook == "training_epoch_end"

    def collect(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = step(self, *args, **kwargs)
        if out is not None:
            idx = kwargs.get("dataloader_idx", args[2] if len(args) > 2 else 0)
            self.__dict__.setdefault("_hora_legacy_outputs", {}).setdefault(hook, {}).setdefault(idx, []).append(
                _as_output(out, training))
        return out

    collect.__name__ = step.__name__
    collect.__qualname__ = step.__qualname__
    collect.__doc__ = step.__doc__
    return collect


def _epoch_end_first(legacy: Any, then: Any, hook: str) -> Any:
    def epoch_end(self: Any) -> None:
        per_loader = self.__dict__.get("_hora_legacy_outputs", {}).pop(hook, {})
        if len(per_loader) > 1:
            outputs: Any = [per_loader[i] for i in sorted(per_loader)]
        else:
            outputs = next(iter(per_loader.values()), [])
        legacy(self, outputs)
        then(self)

    epoch_end.__name__ = then.__name__
    return epoch_end


class _CallbackAdapter:
    """Mixed into the flavor's ``Callback``: forwards 2.x hooks to the 1.x hooks of ``targets``."""

    def __init__(self, targets: Sequence[Any]) -> None:
        super().__init__()
        self._targets = list(targets)

    def _call(self, hook: str, *args: Any) -> None:
        for cb in self._targets:
            fn = getattr(cb, hook, None)
            if callable(fn):
                fn(*args)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._call("on_epoch_start", trainer, pl_module)

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._call("on_epoch_start", trainer, pl_module)

    def on_test_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._call("on_epoch_start", trainer, pl_module)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._call("on_epoch_end", trainer, pl_module)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._call("on_epoch_end", trainer, pl_module)

    def on_test_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._call("on_epoch_end", trainer, pl_module)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._call("on_batch_start", trainer, pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._call("on_batch_end", trainer, pl_module)


class LegacyHooks:
    """Run the 1.x hooks of ``module`` and ``callbacks`` during one fit (a context manager).

    ``with LegacyHooks(module, callbacks, flavor) as legacy:`` swaps the module's class
    (restored on exit); add ``legacy.callbacks`` to the Trainer's callbacks and call
    ``legacy.trainer_built(trainer)`` once the Trainer exists.
    """

    def __init__(self, module: Any, callbacks: Sequence[Any], flavor: Flavor) -> None:
        self.module = module
        self.flavor = flavor
        self._original: type | None = None
        self._init_targets = [cb for cb in callbacks if _defines(cb, "on_init_start") or _defines(cb, "on_init_end")]
        targets = [cb for cb in callbacks if any(_defines(cb, h) for h in _CALLBACK_HOOKS[2:])]
        self.callbacks: list[Any] = []
        if targets:
            base = flavor.sub("callbacks").Callback
            adapter = type("LegacyCallbackHooks", (_CallbackAdapter, base), {"__module__": __name__})
            self.callbacks.append(adapter(targets))

    def __enter__(self) -> LegacyHooks:
        cls = type(self.module)
        hooks = [h for h in _MODULE_HOOKS if _defines(self.module, h)]
        if not hooks:
            return self
        is_overridden = self.flavor.sub("utilities.model_helpers").is_overridden
        ns: dict[str, Any] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
        for hook in hooks:
            step_name, then_name = _MODULE_HOOKS[hook]
            ns[hook] = None  # hidden from Lightning 2's check, which refuses a callable
            if is_overridden(step_name, self.module):
                ns[step_name] = _collecting_step(getattr(cls, step_name), hook)
            ns[then_name] = _epoch_end_first(getattr(cls, hook), getattr(cls, then_name), hook)
        self._original = cls
        self.module.__class__ = type(cls.__name__, (cls,), ns)
        return self

    def trainer_built(self, trainer: Any) -> None:
        for cb in self._init_targets:
            for hook in ("on_init_start", "on_init_end"):
                fn = getattr(cb, hook, None)
                if callable(fn):
                    fn(trainer)

    def __exit__(self, *exc: Any) -> None:
        if self._original is not None:
            self.module.__class__ = self._original
            self.module.__dict__.pop("_hora_legacy_outputs", None)
            self._original = None


__all__ = ["LegacyHooks", "describe_legacy_hooks"]
