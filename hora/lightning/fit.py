"""``fit_module``: train a LightningModule on this rank's batches, Lightning's loop driving.

The worker-side entry of a Lightning estimator, run on every rank of a hora job::

    result = fit_module(module, train_batches=lambda epoch: batches_of(epoch, "train"),
                        val_batches=lambda epoch: batches_of(epoch, "val"), epochs=10,
                        trainer_args={"accumulate_grad_batches": 2}, callbacks=[...],
                        loggers=[TensorBoardLogger(logs_dir)], ckpt_bytes=last_checkpoint,
                        on_epoch_end=report)
    result.state_dict, result.history, result.checkpoint   # rank 0: checkpoint bytes

The Trainer runs with :class:`hora.lightning.Strategy`, or with one of Lightning's sharded
strategies given as ``trainer_args["strategy"]`` (:mod:`hora.lightning.sharded`). After every training epoch
(validation included) every rank averages the epoch's metrics across ranks into one row of
the history, Lightning writes its full checkpoint (weights, optimizers, LR schedulers,
loops: epoch and global step, callbacks, the history) on rank 0, and ``on_epoch_end`` is
called with an :class:`EpochEnd`. Passing that checkpoint back as ``ckpt_bytes`` (or
``ckpt_path``) resumes Lightning where it stopped.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import hora.native as hn
from hora.errors import ConfigError, DataError
from hora.lightning._compat import Flavor, flavor_of_module
from hora.lightning.legacy import LegacyHooks
from hora.lightning.sharded import full_state_dict, on_hora_ranks
from hora.lightning.strategy import strategy_class
from hora.lightning.validate import validate_trainer_args

log = logging.getLogger(__name__)

#: name of Lightning's checkpoint in the work directory
CHECKPOINT_NAME = "hora-last.ckpt"


@dataclass(frozen=True)
class EpochEnd:
    """What :func:`fit_module` tells ``on_epoch_end`` after each training epoch.

    Attributes:
        epoch: the epoch just finished (0-based).
        metrics: its row of the history: every scalar metric logged in the epoch
            (``self.log``; validation metrics when validation ran), averaged across
            ranks, plus ``loss``, the mean training loss, unless the module logs
            ``loss`` itself.
        global_step: optimizer steps taken so far.
        rank: this rank.
        size: the number of ranks.
        checkpoint: Lightning's checkpoint after this epoch, on rank 0; None elsewhere.
    """

    epoch: int
    metrics: dict[str, float]
    global_step: int
    rank: int
    size: int
    checkpoint: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True)
class BatchEnd:
    """What :func:`fit_module` tells ``on_batch_end`` after each training batch.

    Attributes:
        epoch: the current epoch (0-based).
        batch: the batch's index in the epoch.
        loss: this rank's training loss of the batch (as ``training_step`` returned it,
            before Lightning divides it for accumulation), or None when it returned none.
        global_step: optimizer steps taken so far.
        rank: this rank.
    """

    epoch: int
    batch: int
    loss: float | None
    global_step: int
    rank: int


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit_module` returns on every rank.

    Attributes:
        state_dict: the trained module's ``state_dict()``, on the CPU (equal on every rank;
            under one of Lightning's sharded strategies, the whole state on rank 0 and
            empty on the others).
        history: one row per epoch since the first (rows restored from a checkpoint
            included), each ``{"epoch": e, **metrics}`` as in :class:`EpochEnd`.
        checkpoint: Lightning's last checkpoint, on rank 0 (None elsewhere, or when no
            epoch ran and nothing was resumed).
        start_epoch: the first epoch this call trained (> 0 when it resumed).
        epochs_run: the epoch count Lightning reached (its ``current_epoch``).
        global_step: optimizer steps taken, resumed ones included.
        stopped_early: training stopped before ``max_epochs`` (EarlyStopping, ``on_epoch_end``).
        callback_metrics: the last value of every scalar metric Lightning holds, this rank's.
    """

    state_dict: dict[str, torch.Tensor]
    history: list[dict[str, float]]
    checkpoint: bytes | None
    start_epoch: int
    epochs_run: int
    global_step: int
    stopped_early: bool
    callback_metrics: dict[str, float] = field(default_factory=dict)


Batches = Iterable[Any] | Callable[[int], Iterable[Any]]


#: Lightning's loggers: they log INFO through a handler of their own (and on to the root's).
_LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric")


@contextlib.contextmanager
def _lightning_quiet(quiet: bool) -> Iterator[None]:
    """Lightning's loggers at WARNING inside the block (when ``quiet``), as they were after it."""
    if not quiet:
        yield
        return
    loggers = [logging.getLogger(name) for name in _LIGHTNING_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def fit_module(
    module: Any,
    train_batches: Batches | None = None,
    val_batches: Batches | None = None,
    *,
    epochs: int | None = None,
    trainer_args: Mapping[str, Any] | None = None,
    callbacks: Sequence[Any] = (),
    loggers: Sequence[Any] | Any = None,
    data_module: Any = None,
    ckpt_path: str | os.PathLike[str] | None = None,
    ckpt_bytes: bytes | None = None,
    on_epoch_end: Callable[[EpochEnd], bool | None] | None = None,
    on_batch_end: Callable[[BatchEnd], None] | None = None,
    train_steps: int | None = None,
    val_steps: int | None = None,
    work_dir: str | os.PathLike[str] | None = None,
    scale_lr: bool = True,
    terminate_on_nan: bool = False,
    distributed_optimizer_kwargs: Mapping[str, Any] | None = None,
    quiet: bool = False,
) -> FitResult:
    """Train ``module`` data-parallel on this rank's batches; call it on every rank.

    Args:
        module: the LightningModule (trained in place).
        train_batches, val_batches: this rank's batches, each what ``training_step`` /
            ``validation_step`` receives: a re-iterable (a list-like object, a hora
            Reader: ``set_epoch(epoch)`` is called on it when it has one), or a function
            ``epoch -> iterable`` called once per epoch. Every rank must have the same
            number of batches. Not with ``data_module``.
        epochs: ``max_epochs`` (``trainer_args["max_epochs"]`` wins when both are given).
        trainer_args: further Trainer arguments (checked by :func:`validate_trainer_args`).
            ``strategy`` may name one of Lightning's sharded strategies
            (``ModelParallelStrategy``, ``FSDPStrategy``: see :mod:`hora.lightning.sharded`);
            ``scale_lr`` and ``distributed_optimizer_kwargs`` then do not apply.
        callbacks, loggers: Lightning callbacks and loggers (TensorBoardLogger,
            CSVLogger, MLFlowLogger...). Loggers write on rank 0.
        data_module: a LightningDataModule giving the data instead (Lightning shards its
            DataLoaders with a DistributedSampler fed hora's rank and size; a DataModule
            that shards by itself needs ``trainer_args={"use_distributed_sampler": False}``).
        ckpt_path, ckpt_bytes: a Lightning checkpoint (a path or URL, or its bytes, e.g.
            an earlier :attr:`FitResult.checkpoint`) to resume from: epoch, global step,
            optimizer and LR scheduler state, callbacks and history continue from it.
        on_epoch_end: called on every rank after each training epoch with an
            :class:`EpochEnd`; returning True on any rank stops training on all.
        on_batch_end: called on every rank after each training batch with a
            :class:`BatchEnd` (e.g. to report progress; the loss is read only when given).
        train_steps, val_steps: batches per epoch, when the batches have no ``len()``
            (also caps longer ones).
        work_dir: where Lightning writes (``default_root_dir``, the checkpoint); default
            a temporary directory removed at the end.
        scale_lr: multiply learning rates by the number of ranks (as Horovod).
        terminate_on_nan: raise when a training loss is NaN or infinite (Horovod's
            ``terminate_on_nan``).
        distributed_optimizer_kwargs: see :class:`hora.lightning.Strategy`.
        quiet: Lightning's own INFO messages (devices, tips, "fit stopped") and its model
            summary off for this fit; its warnings stay (the estimators at ``verbose<=1``,
            whose driver prints one line per epoch). ``trainer_args`` still win.

    Returns:
        A :class:`FitResult`.

    Raises:
        ConfigError: bad arguments (see :func:`validate_trainer_args`), batches both
            given and from a DataModule, a one-shot iterator for several epochs, no
            epoch count, or both checkpoint arguments.
        DataError: the ranks have different numbers of batches, or a NaN loss with
            ``terminate_on_nan``.
        CollectiveError: a collective failed (another rank died).
    """
    flavor = flavor_of_module(module)
    other_rank = hn.is_initialized() and hn.rank() != 0  # the driver (or rank 0) reports legacy hooks once
    config = validate_trainer_args(module, trainer_args, callbacks=callbacks, loggers=loggers,
                                   data_module=data_module, log_legacy_hooks=not other_rank)
    args = dict(config.trainer_args)
    if epochs is not None:
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
            raise ConfigError(f"epochs must be an integer >= 0, got {epochs!r}")
        args.setdefault("max_epochs", epochs)
    if args.get("max_epochs") is None and args.get("max_steps", -1) == -1:
        raise ConfigError("fit_module needs epochs= (or trainer_args max_epochs / max_steps)")
    if ckpt_path is not None and ckpt_bytes is not None:
        raise ConfigError("give ckpt_path or ckpt_bytes, not both")
    if data_module is not None and (train_batches is not None or val_batches is not None):
        raise ConfigError("give train_batches/val_batches or data_module, not both")
    if data_module is None and train_batches is None:
        raise ConfigError("fit_module needs train_batches (or a data_module)")
    several = args.get("max_epochs") is None or args["max_epochs"] > 1
    train = None if train_batches is None else _EpochBatches(train_batches, train_steps, "train_batches", several)
    val = None if val_batches is None else _EpochBatches(val_batches, val_steps, "val_batches", several)

    hn.init()
    _check_same_lengths(train, val)
    own_dir = work_dir is None
    root = tempfile.mkdtemp(prefix="hora-lightning-") if own_dir else os.fspath(work_dir)
    try:
        os.makedirs(root, exist_ok=True)
        if ckpt_bytes is not None:
            ckpt_path = os.path.join(root, "resume.ckpt")
            with open(ckpt_path, "wb") as fh:
                fh.write(ckpt_bytes)
        recorder = recorder_class(flavor)(root, on_epoch_end, on_batch_end, terminate_on_nan)
        with LegacyHooks(module, config.callbacks, flavor) as legacy, _lightning_quiet(quiet):
            kwargs: dict[str, Any] = {"num_sanity_val_steps": 0, "enable_progress_bar": False,
                                      "logger": config.loggers or False, "default_root_dir": root}
            if quiet:
                kwargs["enable_model_summary"] = False
            kwargs.update(args)
            kwargs["callbacks"] = [*config.callbacks, *legacy.callbacks, recorder]
            kwargs["enable_checkpointing"] = True  # the recorder is a Checkpoint; no default one is added
            sharded = args.get("strategy") is not None
            if sharded:  # one of Lightning's sharded strategies, on hora's ranks
                kwargs["strategy"] = on_hora_ranks(args["strategy"], flavor)
            else:
                kwargs["strategy"] = strategy_class(flavor.name)(
                    scale_lr=scale_lr, distributed_optimizer_kwargs=distributed_optimizer_kwargs)
            trainer = flavor.pl.Trainer(**kwargs)
            legacy.trainer_built(trainer)
            for source in (train, val):
                if source is not None:
                    source.trainer = trainer
            trainer.fit(module, train_dataloaders=train, val_dataloaders=val, datamodule=data_module,
                        ckpt_path=None if ckpt_path is None else os.fspath(ckpt_path))
        checkpoint = recorder.last_checkpoint
        if checkpoint is None and ckpt_bytes is not None and hn.rank() == 0:
            checkpoint = ckpt_bytes  # nothing left to train: the resumed checkpoint is the last
        max_epochs = trainer.max_epochs if trainer.max_epochs is not None else -1
        if sharded:
            state = full_state_dict(trainer, module)
        else:
            state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        return FitResult(
            state_dict=state,
            history=list(recorder.history),
            checkpoint=checkpoint,
            start_epoch=recorder.start_epoch if recorder.start_epoch is not None else trainer.current_epoch,
            epochs_run=trainer.current_epoch,
            global_step=trainer.global_step,
            stopped_early=0 <= trainer.current_epoch < max_epochs,
            callback_metrics=_scalars(trainer.callback_metrics),
        )
    finally:
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)


class _EpochBatches:
    """What Lightning iterates: one epoch of a source at a time (the epoch read from the Trainer)."""

    def __init__(self, source: Batches, steps: int | None, what: str, several_epochs: bool) -> None:
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 0):
            raise ConfigError(f"{what.replace('batches', 'steps')} must be an integer >= 0, got {steps!r}")
        self.per_epoch = callable(source) and not hasattr(source, "__iter__")
        if not self.per_epoch:
            if not hasattr(source, "__iter__"):
                raise ConfigError(f"{what} must be an iterable of batches or a function epoch -> batches, "
                                  f"got {type(source).__name__}")
            if several_epochs and iter(source) is source:
                raise ConfigError(
                    f"{what} is a one-shot iterator ({type(source).__name__}) but training runs several epochs; pass "
                    "a re-iterable (a list, a hora Reader) or a function epoch -> batches"
                )
        self.source = source
        self.steps = steps
        self.what = what
        self.trainer: Any = None

    def known_length(self) -> int | None:
        if self.steps is not None:
            return self.steps
        if not self.per_epoch:
            try:
                return len(self.source)  # type: ignore[arg-type]
            except TypeError:
                return None
        return None

    def __len__(self) -> int:
        n = self.known_length()
        if n is None:
            raise TypeError(f"{self.what} has no len()")
        return n

    def __iter__(self) -> Any:
        epoch = _epoch_of(self.trainer)
        src = self.source(epoch) if self.per_epoch else self.source  # type: ignore[operator]
        set_epoch = getattr(src, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        it = iter(src)
        return it if self.steps is None else itertools.islice(it, self.steps)


def _epoch_of(trainer: Any) -> int:
    """The epoch whose batches Lightning is asking for: the epochs the fit loop has processed, as
    Lightning gives its own samplers. ``current_epoch`` lags by one when a fit resumes from a
    checkpoint written at an epoch's end: Lightning makes the first iterator before it updates
    ``current_epoch``, and the resumed epoch would replay the previous epoch's order."""
    if trainer is None:
        return 0
    progress = getattr(getattr(trainer, "fit_loop", None), "epoch_progress", None)
    if trainer.training and progress is not None:
        return int(progress.current.processed)
    return int(trainer.current_epoch)


def _check_same_lengths(train: _EpochBatches | None, val: _EpochBatches | None) -> None:
    """Every rank must step the same number of times, or collectives would pair wrong steps.

    Raises:
        DataError: naming each rank's batch counts.
    """
    if hn.size() == 1:
        return
    mine = tuple(None if s is None else s.known_length() for s in (train, val))
    every = hn.allgather_object(mine, name="hora.lightning.batch_counts")
    for i, what in enumerate(("train_batches", "val_batches")):
        counts = [c[i] for c in every]
        known = {c for c in counts if c is not None}
        if len(known) > 1:
            shown = ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts))
            raise DataError(f"the ranks have different numbers of {what} per epoch ({shown}); every rank must "
                            "step the same number of times")


def _scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                continue
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[str(key)] = float(value)
    return out


def _mean_across_ranks(row: dict[str, float]) -> dict[str, float]:
    """Each metric averaged over the ranks that have it (sync_dist metrics are unchanged)."""
    if hn.size() == 1:
        return row
    every = hn.allgather_object(row, name="hora.lightning.epoch_metrics")
    keys = sorted({k for r in every for k in r})
    return {k: math.fsum(r[k] for r in every if k in r) / sum(1 for r in every if k in r) for k in keys}


class _Recorder:
    """Mixed into the flavor's ``Checkpoint`` callback (so it runs after the module's
    ``on_train_epoch_end``, with the monitoring callbacks): history, checkpoint, hook."""

    def __init__(self, root: str, on_epoch_end: Callable[[EpochEnd], Any] | None,
                 on_batch_end: Callable[[BatchEnd], Any] | None, terminate_on_nan: bool) -> None:
        super().__init__()
        self.root = root
        self.hook = on_epoch_end
        self.batch_hook = on_batch_end
        self.terminate_on_nan = terminate_on_nan
        self.history: list[dict[str, float]] = []
        self.last_checkpoint: bytes | None = None
        self.start_epoch: int | None = None
        self._loss_sum: Any = 0.0
        self._loss_n = 0
        self._before_val: dict[str, Any] = {}
        self._val_keys: set[str] = set()
        self._validated = False

    @property
    def state_key(self) -> str:
        return "hora.lightning.EpochRecorder"

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.start_epoch = int(trainer.current_epoch)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._loss_sum, self._loss_n, self._validated = 0.0, 0, False

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            if self.batch_hook is not None:
                self.batch_hook(BatchEnd(int(trainer.current_epoch), batch_idx, None, int(trainer.global_step),
                                         hn.rank()))
            return
        loss = loss.detach()
        if pl_module.automatic_optimization:  # Lightning divided it by the accumulation
            loss = loss * trainer.accumulate_grad_batches
        if self.terminate_on_nan and not bool(torch.isfinite(loss)):
            raise DataError(f"rank {hn.rank()}: the training loss is {loss.item()} at epoch {trainer.current_epoch}, "
                            f"batch {batch_idx} (terminate_on_nan)")
        self._loss_sum = self._loss_sum + loss.float()
        self._loss_n += 1
        if self.batch_hook is not None:
            self.batch_hook(BatchEnd(int(trainer.current_epoch), batch_idx, float(loss), int(trainer.global_step),
                                     hn.rank()))

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self._before_val = dict(trainer.callback_metrics)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            after = trainer.callback_metrics
            self._val_keys = {k for k, v in after.items() if k not in self._before_val or self._before_val[k] is not v}
            self._validated = True

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        epoch = int(trainer.current_epoch)
        metrics = _scalars(trainer.callback_metrics)
        if not self._validated:  # values left from an earlier epoch's validation
            metrics = {k: v for k, v in metrics.items() if k not in self._val_keys}
        if "loss" not in metrics and self._loss_n:
            metrics["loss"] = float(self._loss_sum) / self._loss_n
        metrics = _mean_across_ranks(metrics)
        self.history.append({"epoch": epoch, **metrics})
        path = os.path.join(self.root, CHECKPOINT_NAME)
        trainer.save_checkpoint(path + ".tmp")  # every rank takes part; rank 0 writes
        data = None
        if trainer.is_global_zero:
            os.replace(path + ".tmp", path)
            with open(path, "rb") as fh:
                data = fh.read()
            self.last_checkpoint = data
        if self.hook is not None:
            stop = self.hook(EpochEnd(epoch, dict(metrics), int(trainer.global_step), hn.rank(), hn.size(), data))
            if trainer.strategy.reduce_boolean_decision(bool(stop), all=False):
                log.info("on_epoch_end asked to stop after epoch %d", epoch)
                trainer.should_stop = True


_RECORDERS: dict[str, type] = {}


def recorder_class(flavor: Flavor) -> type:
    """The epoch recorder callback class built on ``flavor``'s ``Checkpoint``."""
    if flavor.name not in _RECORDERS:
        base = flavor.sub("callbacks").Checkpoint
        _RECORDERS[flavor.name] = type("EpochRecorder", (_Recorder, base), {"__module__": __name__})
    return _RECORDERS[flavor.name]


__all__ = ["BatchEnd", "EpochEnd", "FitResult", "fit_module"]
