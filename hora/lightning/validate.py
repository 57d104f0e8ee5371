"""Driver-side checks of a LightningModule and its Trainer arguments, before any worker starts.

:func:`validate_trainer_args` is what an estimator calls in ``fit`` on the driver (and what
:func:`hora.lightning.fit_module` calls again on every rank): every mistake it can see
without training is a :class:`~hora.errors.ConfigError` naming the argument.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import numbers
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hora.errors import ConfigError
from hora.lightning._compat import Flavor, flavor_name_of, flavor_of_module

log = logging.getLogger(__name__)

_BATCH_LIMITS = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches")
_NON_NEGATIVE_INTS = ("log_every_n_steps", "num_sanity_val_steps", "reload_dataloaders_every_n_epochs")


@dataclass(frozen=True)
class TrainerConfig:
    """What :func:`validate_trainer_args` accepted, normalized.

    Attributes:
        package: ``"lightning"`` or ``"pytorch_lightning"``, the module's import name.
        trainer_args: the Trainer keyword arguments, without ``callbacks`` (and without
            ``logger`` unless it is True or False).
        callbacks: every Lightning callback (the ``callbacks`` argument, or
            ``trainer_args["callbacks"]``).
        loggers: every Lightning logger (the ``loggers`` argument, or
            ``trainer_args["logger"]``); empty for no logging.
    """

    package: str
    trainer_args: dict[str, Any] = field(default_factory=dict)
    callbacks: list[Any] = field(default_factory=list)
    loggers: list[Any] = field(default_factory=list)


def validate_trainer_args(
    module: Any,
    trainer_args: Mapping[str, Any] | None = None,
    *,
    callbacks: Sequence[Any] | Any = (),
    loggers: Sequence[Any] | Any = None,
    data_module: Any = None,
    log_legacy_hooks: bool = True,
) -> TrainerConfig:
    """Check a LightningModule, its Trainer arguments, callbacks, loggers and DataModule.

    Checks: ``module`` is a LightningModule defining ``training_step`` and
    ``configure_optimizers``; every ``trainer_args`` key is a parameter of that
    Lightning's ``Trainer`` and none is one hora owns (``strategy``, unless it is one of
    Lightning's sharded strategies, see :mod:`hora.lightning.sharded`; ``devices`` other
    than 1 or "auto" and ``num_nodes`` other than 1, since hora's launcher decides the
    ranks; a cluster environment among the plugins); ``accumulate_grad_batches``, ``gradient_clip_val``,
    ``gradient_clip_algorithm``, ``precision``, ``max_epochs``, ``max_steps``,
    ``limit_*_batches``, ``log_every_n_steps`` and ``num_sanity_val_steps`` have
    values Lightning accepts; callbacks, loggers and the DataModule come from the same
    Lightning package as the module; callbacks and loggers are given once (as arguments
    or in ``trainer_args``, not both). Hooks removed in Lightning 2.0 that hora still runs
    (``validation_epoch_end``, a callback's ``on_epoch_end``, ...) are logged.

    Args:
        module: the LightningModule.
        trainer_args: Trainer keyword arguments.
        callbacks, loggers: Lightning callbacks and loggers (one or a list).
        data_module: a LightningDataModule, or None.
        log_legacy_hooks: log a warning per Lightning 1.x hook found.

    Returns:
        The normalized :class:`TrainerConfig`.

    Raises:
        ConfigError: naming the first argument, key or object that is wrong.
    """
    flavor = flavor_of_module(module)
    _check_module(module, flavor)
    if trainer_args is None:
        trainer_args = {}
    if not isinstance(trainer_args, Mapping):
        raise ConfigError(f"trainer_args must be a dict of Trainer arguments, got {type(trainer_args).__name__}")
    args = dict(trainer_args)
    _check_keys(args, flavor, module)
    _check_values(args)
    cbs = _as_list(callbacks, "callbacks")
    if "callbacks" in args:
        if cbs:
            raise ConfigError("callbacks were given both as callbacks= and in trainer_args['callbacks']; give them once")
        cbs = _as_list(args.pop("callbacks"), "trainer_args['callbacks']")
    lgs = _as_list(loggers, "loggers")
    if "logger" in args:
        if lgs:
            raise ConfigError("loggers were given both as loggers= and in trainer_args['logger']; give them once")
        if not isinstance(args["logger"], bool):  # True/False stay Trainer arguments
            lgs = _as_list(args.pop("logger"), "trainer_args['logger']")
    base_cb = flavor.sub("callbacks").Callback
    for i, cb in enumerate(cbs):
        _check_kind(cb, base_cb, flavor, f"callbacks[{i}]", "Callback")
    base_logger = flavor.sub("loggers").Logger
    for i, lg in enumerate(lgs):
        _check_kind(lg, base_logger, flavor, f"loggers[{i}]", "Logger")
    if data_module is not None:
        _check_kind(data_module, flavor.pl.LightningDataModule, flavor, "data_module", "LightningDataModule")
    from hora.lightning.legacy import describe_legacy_hooks

    if log_legacy_hooks:
        for line in describe_legacy_hooks(module, cbs):
            log.warning("%s", line)
    return TrainerConfig(flavor.name, args, cbs, lgs)


def _check_module(module: Any, flavor: Flavor) -> None:
    is_overridden = flavor.sub("utilities.model_helpers").is_overridden
    name = type(module).__name__
    for hook in ("training_step", "configure_optimizers"):
        if not is_overridden(hook, module):
            raise ConfigError(
                f"the LightningModule {name} does not define {hook}(); Lightning needs training_step() and "
                "configure_optimizers() to train"
            )


def _trainer_parameters(flavor: Flavor) -> list[str]:
    params = inspect.signature(flavor.pl.Trainer.__init__).parameters
    return [p for p in params if p != "self"]


def _check_keys(args: dict[str, Any], flavor: Flavor, module: Any) -> None:
    known = _trainer_parameters(flavor)
    for key in args:
        if not isinstance(key, str):
            raise ConfigError(f"trainer_args keys must be strings, got {key!r}")
        if key == "strategy":  # hora's data parallelism, or one of Lightning's sharded strategies on hora's ranks
            from hora.lightning.sharded import check_sharded_strategy

            check_sharded_strategy(args[key], flavor, module)
            continue
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"trainer_args key {key!r} is not a parameter of {flavor.name}.Trainer{hint}")
    devices = args.get("devices", "auto")
    if devices not in ("auto", 1, "1", [0]) and devices is not None:
        raise ConfigError(
            f"trainer_args['devices']={devices!r}: under hora each rank trains on one device (its local GPU or "
            "the CPU); choose the number of ranks with num_proc instead"
        )
    plugins = args.get("plugins")
    environment = flavor.fabric_sub("plugins").ClusterEnvironment
    for i, plugin in enumerate(_as_list(plugins, "trainer_args['plugins']") if plugins is not None else []):
        if isinstance(plugin, environment):
            raise ConfigError(
                f"trainer_args['plugins'][{i}] is a cluster environment ({type(plugin).__name__}); hora's launcher "
                "tells every rank who it is, so remove it"
            )
    if args.get("num_nodes", 1) != 1:
        raise ConfigError(
            f"trainer_args['num_nodes']={args['num_nodes']!r}: hora's launcher places the ranks on hosts; remove "
            "num_nodes and choose the number of ranks with num_proc"
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_values(args: dict[str, Any]) -> None:
    if "accumulate_grad_batches" in args:
        value = args["accumulate_grad_batches"]
        if not _is_int(value) or value < 1:
            raise ConfigError(
                f"trainer_args['accumulate_grad_batches'] must be an integer >= 1, got {value!r} (for a schedule use "
                "Lightning's GradientAccumulationScheduler callback)"
            )
    if args.get("gradient_clip_val") is not None:
        value = args["gradient_clip_val"]
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
            raise ConfigError(f"trainer_args['gradient_clip_val'] must be a number >= 0, got {value!r}")
    if args.get("gradient_clip_algorithm") is not None:
        value = args["gradient_clip_algorithm"]
        if str(value).lower() not in ("norm", "value"):
            raise ConfigError(f"trainer_args['gradient_clip_algorithm'] must be 'norm' or 'value', got {value!r}")
    if args.get("precision") is not None:
        value = args["precision"]
        allowed = _precisions()
        if allowed and value not in allowed:
            shown = ", ".join(repr(v) for v in allowed)
            raise ConfigError(f"trainer_args['precision']={value!r} is not one of Lightning's precisions: {shown}")
    for key, low in (("max_epochs", -1), ("max_steps", -1), ("min_epochs", 0), ("min_steps", 0)):
        value = args.get(key)
        if value is not None and (not _is_int(value) or value < low):
            raise ConfigError(f"trainer_args[{key!r}] must be an integer >= {low}, got {value!r}")
    for key in _BATCH_LIMITS:
        value = args.get(key)
        if value is None:
            continue
        ok = (_is_int(value) and value >= 0) or (
            isinstance(value, float) and 0.0 <= value <= 1.0)
        if not ok:
            raise ConfigError(
                f"trainer_args[{key!r}] must be an integer number of batches >= 0 or a fraction in [0, 1], "
                f"got {value!r}"
            )
    for key in _NON_NEGATIVE_INTS:
        value = args.get(key)
        if value is not None and (not _is_int(value) or value < 0):
            raise ConfigError(f"trainer_args[{key!r}] must be an integer >= 0, got {value!r}")


def _precisions() -> list[Any]:
    """Every value Lightning's ``precision=`` accepts, read from its type hints (empty if unreadable)."""
    import importlib

    for name in ("lightning.fabric.plugins.precision.precision", "lightning_fabric.plugins.precision.precision"):
        try:
            hint = importlib.import_module(name)._PRECISION_INPUT
        except (ImportError, AttributeError):
            continue
        out: list[Any] = []
        stack = [hint]
        while stack:
            item = stack.pop()
            args = typing.get_args(item)
            if args:
                stack.extend(reversed(args))
            else:
                out.append(item)
        return out
    return []


def _as_list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (str, bytes, Mapping)):
        raise ConfigError(f"{what} must be a Lightning object or a list of them, got {type(value).__name__}")
    if isinstance(value, Iterable):
        return list(value)
    return [value]


def _check_kind(obj: Any, base: type, flavor: Flavor, what: str, kind: str) -> None:
    if isinstance(obj, base):
        return
    other = flavor_name_of(obj)
    if other is not None and other != flavor.name:
        raise ConfigError(
            f"{what} is a {other} {type(obj).__name__}, but the module is a {flavor.name} LightningModule; "
            f"import every Lightning class from {flavor.name}"
        )
    raise ConfigError(f"{what} must be a {flavor.name} {kind}, got {type(obj).__module__}.{type(obj).__qualname__}")


__all__ = ["TrainerConfig", "validate_trainer_args"]
