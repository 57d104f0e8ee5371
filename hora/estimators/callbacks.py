"""Training callbacks run inside every worker: epoch and batch hooks, early stopping, best model.

Callbacks are pickled into the training spec and run on every rank. The ``logs``
they receive hold metrics already averaged across ranks (epoch logs), so every rank
takes the same decision; a callback that should act once (write a file) checks
``context.rank == 0``.

A callback sees a :class:`CallbackContext` with the rank, the size, the run id, the
store, the estimator's JSON params, the ``model`` being trained and its ``optimizer``
(the framework's objects on this rank: a ``torch.nn.Module`` and hora's
``DistributedOptimizer`` for PyTorch, a ``keras.Model`` and its optimizer for Keras; for
Lightning the ``LightningModule``, whose Trainer makes the optimizers: ``optimizer`` is None
there, ``ctx.model.optimizers()`` gives them while the Trainer runs), ``stop_training``
(set it to True to end training after this epoch), ``state_bytes()`` (a checkpoint of the
current model; with ``strategy='zero1'`` / ``'zero2'`` it gathers the optimizer's shards, so every
rank must call it, as :class:`BestModelCheckpoint` does) and ``model_files()`` (the model as a saved hora model holds it). Before anything is
launched, the driver calls each callback's :meth:`Callback.prepare` with the config
(:class:`MLflowLogger` checks its tracking server there).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from hora.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass
class CallbackContext:
    """What a callback can see and change while a worker trains.

    Attributes:
        rank, size: this worker's rank and the number of ranks.
        run_id: the run's id; ``store``: the hora Store (checkpoints, logs).
        epoch: the current epoch (0-based); ``step``: the batch index in the epoch.
        stop_training: set to True to stop after the current epoch (all ranks agree,
            because every rank runs the same callbacks on the same averaged logs).
        state_bytes: returns a checkpoint of the current model and optimizer (the session's format).
        model_files: returns the current model as the framework codec saves it (``{name: bytes}``).
        params: the estimator's JSON parameters.
        model: the model this rank trains (the framework's object; changing its weights changes
            training: every rank runs the same callbacks, so keep them alike).
        optimizer: its optimizer (for PyTorch hora's ``DistributedOptimizer``: ``param_groups``
            hold the learning rates, after ``lr_scaling``; the ``lr_scheduler`` is ``extra["lr_scheduler"]``).
        extra: free space for callbacks to share state.
    """

    rank: int
    size: int
    run_id: str
    store: Any
    epoch: int = 0
    step: int = 0
    stop_training: bool = False
    state_bytes: Callable[[], bytes] | None = None
    model_files: Callable[[], dict[str, bytes]] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    model: Any = None
    optimizer: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


class Callback:
    """Base class of training callbacks; override the hooks you need (all are no-ops)."""

    def prepare(self, config: Any) -> None:
        """Called on the driver with the estimator's config before anything is launched (validate here)."""

    def on_train_begin(self, ctx: CallbackContext) -> None:
        """Called once before the first epoch (after a resume, before the resumed epoch)."""

    def on_epoch_begin(self, ctx: CallbackContext, epoch: int) -> None:
        """Called before each epoch."""

    def on_batch_end(self, ctx: CallbackContext, step: int, logs: dict[str, float]) -> None:
        """Called after each training batch with this rank's ``{"loss": ...}`` (not averaged)."""

    def on_epoch_end(self, ctx: CallbackContext, epoch: int, logs: dict[str, float]) -> None:
        """Called after each epoch with the metrics averaged across ranks (``loss``, ``val_loss``, ``val_<metric>``)."""

    def on_train_end(self, ctx: CallbackContext, history: list[dict[str, float]]) -> None:
        """Called once after the last epoch."""

    def on_train_result(self, ctx: CallbackContext, history: list[dict[str, float]]) -> None:
        """Called once after :meth:`on_train_end` of every callback and any restore of a best state:
        ``ctx.model_files()`` is then the model ``fit`` returns."""


def _improved(mode: str, value: float, best: float, min_delta: float) -> bool:
    if mode == "min":
        return value < best - min_delta
    return value > best + min_delta


class EarlyStopping(Callback):
    """Stop training when ``monitor`` has not improved for ``patience`` epochs.

    Args:
        monitor: the epoch log key to watch (default ``"val_loss"``; ``"loss"`` without validation).
        patience: epochs without improvement before stopping.
        min_delta: smallest change that counts as an improvement.
        mode: ``"min"`` (lower is better), ``"max"``, or ``"auto"`` (``max`` for names
            containing ``acc``/``auc``/``f1``/``precision``/``recall``, else ``min``).

    Raises:
        ConfigError: bad patience or mode; at the first epoch end, a ``monitor`` key
            missing from the logs (the message lists the keys there are).
    """

    def __init__(self, monitor: str = "val_loss", patience: int = 0, min_delta: float = 0.0, mode: str = "auto") -> None:
        if not isinstance(patience, int) or patience < 0:
            raise ConfigError(f"EarlyStopping patience must be an int >= 0, got {patience!r}")
        if mode not in ("min", "max", "auto"):
            raise ConfigError(f"EarlyStopping mode must be 'min', 'max' or 'auto', got {mode!r}")
        if mode == "auto":
            lowered = monitor.lower()
            mode = "max" if any(k in lowered for k in ("acc", "auc", "f1", "precision", "recall")) else "min"
        self.monitor = monitor
        self.patience = patience
        self.min_delta = abs(float(min_delta))
        self.mode = mode
        self.best = math.inf if mode == "min" else -math.inf
        self.wait = 0
        self.stopped_epoch: int | None = None

    def on_train_begin(self, ctx: CallbackContext) -> None:
        self.best = math.inf if self.mode == "min" else -math.inf
        self.wait = 0
        self.stopped_epoch = None

    def on_epoch_end(self, ctx: CallbackContext, epoch: int, logs: dict[str, float]) -> None:
        if self.monitor not in logs:
            raise ConfigError(f"EarlyStopping monitors {self.monitor!r} but the epoch logs hold {sorted(logs)}")
        value = float(logs[self.monitor])
        if _improved(self.mode, value, self.best, self.min_delta):
            self.best = value
            self.wait = 0
            return
        self.wait += 1
        if self.wait > self.patience:
            self.stopped_epoch = epoch
            ctx.stop_training = True
            if ctx.rank == 0:
                logger.info("early stopping at epoch %d: %s did not improve on %.6g for %d epochs",
                            epoch, self.monitor, self.best, self.wait)


class BestModelCheckpoint(Callback):
    """Keep the model state of the best epoch by ``monitor``; optionally restore it at the end.

    Rank 0 writes the best state to ``runs/<run_id>/best.ckpt`` in the store (atomically)
    each time it improves. With ``restore_best=True`` every rank loads the best state
    after training, so the fitted model is the best one rather than the last one.

    Args:
        monitor, mode, min_delta: as in :class:`EarlyStopping`.
        restore_best: load the best weights back at the end of training.
    """

    FILE = "best.ckpt"

    def __init__(self, monitor: str = "val_loss", mode: str = "auto", min_delta: float = 0.0, restore_best: bool = True) -> None:
        if mode not in ("min", "max", "auto"):
            raise ConfigError(f"BestModelCheckpoint mode must be 'min', 'max' or 'auto', got {mode!r}")
        if mode == "auto":
            lowered = monitor.lower()
            mode = "max" if any(k in lowered for k in ("acc", "auc", "f1", "precision", "recall")) else "min"
        self.monitor = monitor
        self.mode = mode
        self.min_delta = abs(float(min_delta))
        self.restore_best = restore_best
        self.best = math.inf if mode == "min" else -math.inf
        self.best_epoch: int | None = None
        self.best_state: bytes | None = None

    def path(self, ctx: CallbackContext) -> str:
        """Store path of the best checkpoint of this run."""
        return ctx.store.layout.run_dir(ctx.run_id) + "/" + self.FILE

    def on_epoch_end(self, ctx: CallbackContext, epoch: int, logs: dict[str, float]) -> None:
        if self.monitor not in logs:
            raise ConfigError(f"BestModelCheckpoint monitors {self.monitor!r} but the epoch logs hold {sorted(logs)}")
        value = float(logs[self.monitor])
        if not _improved(self.mode, value, self.best, self.min_delta):
            return
        self.best = value
        self.best_epoch = epoch
        if ctx.state_bytes is None:
            return
        self.best_state = ctx.state_bytes()
        if ctx.rank == 0:
            ctx.store.write_bytes(self.path(ctx), self.best_state)
            logger.info("best model so far at epoch %d (%s=%.6g) saved to %s", epoch, self.monitor, value, self.path(ctx))

    def on_train_end(self, ctx: CallbackContext, history: list[dict[str, float]]) -> None:
        if self.restore_best and self.best_state is not None:
            ctx.extra["restore_state"] = self.best_state
            ctx.extra["restored_epoch"] = self.best_epoch


class MLflowLogger(Callback):
    """Log a fit to MLflow: the estimator's JSON params, per-epoch metrics and the fitted model.

    Rank 0 logs, to one MLflow run: every JSON parameter of the estimator (as params),
    the epoch logs (``loss``, ``val_loss``, ``val_<metric>``, ...) with ``step=epoch``,
    and with ``log_model`` the fitted model's files (as a saved hora model holds them)
    under the artifact path ``model``.

    Args:
        tracking_uri: the tracking server or store (``http://...``, ``sqlite:///...``);
            default: the driver's (``mlflow.get_tracking_uri()``).
        experiment: the experiment's name (created if missing); default: the active one.
        run_id: an existing MLflow run to log to; default: the driver's active run when
            ``tracking_uri`` is not given, else a new run (ended when training ends).
        log_model: log the fitted model as an artifact.

    Raises:
        ConfigError: bad arguments; on the driver before launch (:meth:`prepare`),
            mlflow missing, a tracking URI that cannot be reached, or an unknown run.

    After ``fit``, ``run_id_`` and ``tracking_uri_`` say where the run was logged.
    """

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None, run_id: str | None = None,
                 log_model: bool = True) -> None:
        for name, value in (("tracking_uri", tracking_uri), ("experiment", experiment), ("run_id", run_id)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"MLflowLogger {name} must be a non-empty string or None, got {value!r}")
        if not isinstance(log_model, bool):
            raise ConfigError(f"MLflowLogger log_model must be True or False, got {log_model!r}")
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_id = run_id
        self.log_model = log_model
        self.tracking_uri_: str | None = None
        self.run_id_: str | None = None
        self._created = False

    def prepare(self, config: Any) -> None:
        from hora.estimators.mlflow_support import resolve_run

        self.tracking_uri_, self.run_id_, self._created = resolve_run(
            self.tracking_uri, self.experiment, self.run_id, run_name=getattr(config, "run_id", None))

    def _client(self) -> Any:
        if self.run_id_ is None:
            raise ConfigError("MLflowLogger was not prepared on the driver (use it in an estimator's callbacks)")
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.tracking_uri_)

    def on_train_begin(self, ctx: CallbackContext) -> None:
        if ctx.rank != 0:
            return
        from hora.estimators.mlflow_support import log_params

        log_params(self._client(), self.run_id_, {**ctx.params, "hora_run_id": ctx.run_id, "num_proc": ctx.size})

    def on_epoch_end(self, ctx: CallbackContext, epoch: int, logs: dict[str, float]) -> None:
        if ctx.rank != 0:
            return
        from mlflow.entities import Metric

        import time as _time

        now = int(_time.time() * 1000)
        metrics = [Metric(k, float(v), now, epoch) for k, v in logs.items() if isinstance(v, (int, float))]
        self._client().log_batch(self.run_id_, metrics=metrics)

    def on_train_result(self, ctx: CallbackContext, history: list[dict[str, float]]) -> None:
        if ctx.rank != 0:
            return
        client = self._client()
        if self.log_model and ctx.model_files is not None:
            from hora.estimators.mlflow_support import log_files

            log_files(client, self.run_id_, ctx.model_files(), "model")
        if self._created:
            client.set_terminated(self.run_id_)


__all__ = ["Callback", "CallbackContext", "EarlyStopping", "BestModelCheckpoint", "MLflowLogger"]
