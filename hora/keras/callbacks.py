"""Keras 3 callbacks for data-parallel training with hora (Horovod's set).

Put :class:`BroadcastGlobalVariablesCallback` first and :class:`MetricAverageCallback`
before any callback that reads metrics (checkpointing, early stopping, LR on plateau).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

import hora.native as hn
from hora.errors import CollectiveError, ConfigError

log = logging.getLogger(__name__)


def _optimizer_variables(optimizer) -> list:
    if optimizer is None or not getattr(optimizer, "built", False):
        return []
    return list(optimizer.variables)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Copy ``root_rank``'s model and optimizer variables to every rank when training starts.

    ``model.fit`` builds the optimizer before ``on_train_begin``, so both are broadcast
    there and every rank takes its first step from the same state. An optimizer that is
    not built yet is broadcast after the first batch. ``local_variables`` (variables
    each rank keeps its own, e.g. a model-parallel embedding) are not broadcast.
    ``device`` is accepted for Horovod compatibility and unused.
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables: Any = None) -> None:
        super().__init__()
        if not isinstance(root_rank, int) or root_rank < 0:
            raise ConfigError(f"BroadcastGlobalVariablesCallback: root_rank must be an int >= 0, got {root_rank!r}")
        self.root_rank = root_rank
        self.device = device
        if local_variables is not None and not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        self._local = {id(v) for v in local_variables or ()}
        self.broadcast_done = False
        self._optimizer_done = False

    def _broadcast(self) -> None:
        from hora.tensorflow.functions import broadcast_variables

        if self.root_rank >= hn.size():
            raise ConfigError(f"BroadcastGlobalVariablesCallback: root_rank={self.root_rank} but the job has "
                              f"{hn.size()} ranks")
        broadcast_variables([v for v in self.model.variables if id(v) not in self._local], root_rank=self.root_rank)
        opt_vars = _optimizer_variables(getattr(self.model, "optimizer", None))
        if opt_vars:
            broadcast_variables(opt_vars, root_rank=self.root_rank)
            self._optimizer_done = True
        self.broadcast_done = True
        log.debug("broadcast %d model and %d optimizer variables from rank %d",
                  len(self.model.variables), len(opt_vars), self.root_rank)

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not self.broadcast_done:
            self._broadcast()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if not self._optimizer_done:
            from hora.tensorflow.functions import broadcast_variables

            opt_vars = _optimizer_variables(getattr(self.model, "optimizer", None))
            if opt_vars:
                broadcast_variables(opt_vars, root_rank=self.root_rank)
            self._optimizer_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the epoch's metrics (``logs``) across ranks at the end of every epoch.

    Each rank computes its metrics on its own shard; afterwards ``logs`` holds their
    mean on every rank, so checkpointing and early stopping decide alike everywhere.

    Raises (from ``on_epoch_end``):
        CollectiveError: ranks report different metric names.
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()
        self.device = device
        self._checked_keys: tuple | None = None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is None or hn.size() == 1:
            return
        keys = tuple(sorted(k for k, v in logs.items() if _is_number(v)))
        if keys != self._checked_keys:
            every = hn.allgather_object(keys)
            for r, other in enumerate(every):
                if other != keys:
                    raise CollectiveError(
                        f"MetricAverageCallback: rank {hn.rank()} has metrics {list(keys)} but rank {r} has "
                        f"{list(other)}; every rank must log the same metrics"
                    )
            self._checked_keys = keys
        if not keys:
            return
        values = np.array([float(np.asarray(logs[k])) for k in keys], dtype=np.float64)
        averaged = hn.allreduce(values, op=hn.Average, name=f"hora.keras.metrics.{epoch}")
        for k, v in zip(keys, np.asarray(averaged).tolist()):
            logs[k] = v


def _is_number(v: Any) -> bool:
    try:
        arr = np.asarray(v)
    except Exception:  # noqa: BLE001 - anything not array-like is not a metric
        return False
    return arr.shape == () and arr.dtype.kind in "biuf"


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` between ``start_epoch`` and ``end_epoch``.

    ``multiplier`` is a number or a function of the (fractional, unless ``staircase``)
    epoch. With ``staircase=True`` the rate changes at epoch starts; otherwise at every
    batch, with ``epoch + batch / steps_per_epoch`` (``steps_per_epoch`` defaults to the
    count ``model.fit`` reports). The optimizer's learning rate must be a number or
    variable, not a ``LearningRateSchedule``.

    ``momentum_correction`` (Horovod rescales momentum for one step when the rate
    changes) is not available: Keras 3 bakes an optimizer's momentum into its compiled
    step as a constant. Left unset (Horovod's default is on), training goes on without it
    and a warning says so once if the optimizer has a momentum.

    Raises:
        ConfigError: bad arguments, or a ``LearningRateSchedule`` learning rate.
        NotImplementedError: ``momentum_correction=True``.
    """

    def __init__(
        self,
        initial_lr: float,
        multiplier: float | Callable[[float], float],
        start_epoch: int = 0,
        end_epoch: int | None = None,
        staircase: bool = True,
        momentum_correction: bool | None = None,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ) -> None:
        super().__init__()
        self._warn_momentum = momentum_correction is None
        if momentum_correction:
            raise NotImplementedError(
                "momentum_correction is not supported with Keras 3: the optimizer's momentum is a Python constant "
                "compiled into the train step, so it cannot be rescaled per batch; pass momentum_correction=False"
            )
        if not isinstance(initial_lr, (int, float)) or isinstance(initial_lr, bool) or initial_lr <= 0:
            raise ConfigError(f"initial_lr must be a positive number, got {initial_lr!r}")
        if not callable(multiplier) and not isinstance(multiplier, (int, float)):
            raise ConfigError(f"multiplier must be a number or a function of the epoch, got {multiplier!r}")
        if end_epoch is not None and end_epoch <= start_epoch:
            raise ConfigError(f"end_epoch={end_epoch} must be > start_epoch={start_epoch}")
        if steps_per_epoch is not None and steps_per_epoch < 1:
            raise ConfigError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch, m=float(multiplier): m)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch: int | None = None

    def _in_range(self, epoch: float) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set_lr(self, epoch: float) -> None:
        opt = self.model.optimizer
        if isinstance(opt._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            raise ConfigError(
                f"{type(self).__name__}: the optimizer's learning_rate is a LearningRateSchedule; these callbacks "
                "set the rate themselves, so create the optimizer with a number"
            )
        value = self.initial_lr * float(self.multiplier(epoch))
        opt.learning_rate = value
        if self.verbose:
            log.info("epoch %.3f: learning rate set to %g", epoch, value)

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self._warn_momentum and float(getattr(self.model.optimizer, "momentum", 0.0) or 0.0) != 0.0:
            log.warning("%s: Horovod would apply momentum correction when the learning rate changes; hora cannot "
                        "with Keras 3 (the momentum is compiled into the train step), so training goes on without "
                        "it. Pass momentum_correction=False to silence this.", type(self).__name__)
            self._warn_momentum = False
        if self.steps_per_epoch is None and not self.staircase:
            steps = (self.params or {}).get("steps")
            if not steps:
                raise ConfigError(f"{type(self).__name__}: pass steps_per_epoch (model.fit did not report it)")
            self.steps_per_epoch = int(steps)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.current_epoch = epoch
        if self.staircase and self._in_range(epoch):
            self._set_lr(epoch)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.staircase or self.current_epoch is None:
            return
        epoch = self.current_epoch + float(batch) / self.steps_per_epoch
        if self._in_range(epoch):
            self._set_lr(epoch)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["learning_rate"] = float(np.asarray(self.model.optimizer.learning_rate))


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``.

    For large effective batches (Goyal et al., 2017): ``initial_lr`` is the already scaled
    rate (e.g. ``0.01 * hvd.size()``); during warm-up the rate at fractional epoch ``e``
    is ``initial_lr / size * (e * (size - 1) / warmup_epochs + 1)``, updated every batch.
    """

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: int = 5,
        momentum_correction: bool | None = None,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ) -> None:
        if not isinstance(warmup_epochs, (int, float)) or warmup_epochs <= 0:
            raise ConfigError(f"warmup_epochs must be > 0, got {warmup_epochs!r}")
        self.warmup_epochs = warmup_epochs

        def multiplier(epoch: float) -> float:
            size = hn.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch, verbose=verbose)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == math.ceil(self.warmup_epochs) - 1:
            # the ramp stops one batch short of the target: land exactly on initial_lr
            self.model.optimizer.learning_rate = self.initial_lr
            if logs is not None:
                logs["learning_rate"] = self.initial_lr
            if self.verbose:  # printed like Keras' own callbacks' verbose messages (and Horovod's)
                from keras.src.utils.io_utils import print_msg

                print_msg(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {self.initial_lr:g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Save the model whenever ``monitor`` improves; only rank 0 writes (Horovod's arguments).

    ``filepath`` (a ``.keras`` file, or ``.weights.h5`` with ``save_weights_only``) may be
    left ``None`` and set (``callback.filepath = ...``) before training, as Horovod's
    estimators do. Put :class:`MetricAverageCallback` before it so every rank sees the
    same metric.

    Raises:
        ConfigError: training starts with no ``filepath``, or one with the wrong suffix;
            a file name passed as ``monitor`` (the first parameter, as in Horovod).
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        verbose: int = 0,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: str | int = "epoch",
        filepath: str | None = None,
    ) -> None:
        if str(monitor).endswith((".keras", ".h5")):
            raise ConfigError(f"BestModelCheckpoint: {monitor!r} was passed as `monitor` (the first parameter, as in "
                              "Horovod); pass the file as filepath=...")
        self._suffix = ".weights.h5" if save_weights_only else ".keras"
        self._check_path(filepath, allow_none=True)
        super().__init__(filepath=f"unset{self._suffix}" if filepath is None else filepath, monitor=monitor,
                         verbose=verbose, save_best_only=True, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq)
        if filepath is None:
            self.filepath = None

    def _check_path(self, filepath: Any, allow_none: bool = False) -> None:
        if filepath is None:
            if allow_none:
                return
            raise ConfigError(f"BestModelCheckpoint: set filepath (a path ending in {self._suffix}) before training")
        if not str(filepath).endswith(self._suffix):
            raise ConfigError(f"BestModelCheckpoint: filepath must end in {self._suffix}, got {filepath!r}")

    def _is_writer(self) -> bool:
        return not hn.is_initialized() or hn.rank() == 0

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._check_path(self.filepath)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._is_writer():
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._is_writer():
            super().on_epoch_end(epoch, logs)


__all__ = [
    "BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
    "LearningRateWarmupCallback", "BestModelCheckpoint",
]
