"""PyTorch Lightning on the estimator seam: :class:`LightningCodec`, :class:`LightningSession`, :data:`LIGHTNING`.

``hora.spark.LightningEstimator`` (``hora.spark.lightning.TorchEstimator`` is Horovod's name of it)
and ``hora.dask.LightningEstimator`` take a ``LightningModule`` as ``model`` (its
``training_step``, ``validation_step``, ``configure_optimizers`` and hooks), and besides
the shared parameters :class:`LightningConfig`'s: ``trainer_args`` (``max_epochs`` comes
from ``epochs``; ``accumulate_grad_batches``, ``gradient_clip_val``, ``precision``, ...),
Lightning callbacks in ``callbacks`` (with hora's), ``logger`` (TensorBoardLogger,
CSVLogger, MLFlowLogger, one or a list), an optional ``data_module``, ``profiler``,
``terminate_on_nan``, ``log_every_n_steps``. Without ``logger`` it logs to a TensorBoardLogger in the
run's logs folder of the store (``store.get_logs_path(run_id)``), as Horovod's did. A plain
``torch.nn.Module`` given with ``optimizer=`` and ``loss=`` is trained through
:func:`hora.lightning.plain_module.to_lightning_module` (Horovod's legacy path).

Lightning's own loop trains, through :class:`hora.lightning.Strategy` (gradients averaged
by hora's DistributedOptimizer), or through one of Lightning's sharded strategies given as
``trainer_args={"strategy": ModelParallelStrategy()}`` (or ``"model_parallel"``; ``"fsdp"``
/ ``FSDPStrategy`` on GPUs) for a model larger than one rank: see
:mod:`hora.lightning.sharded`. Its checkpoints are written whole by rank 0, and the fitted
model is returned whole. Each batch ``training_step`` gets is a dict of tensors by
column (a feature group under its key ``"[a,b,...]"``), features reshaped to
``input_shapes`` and cast to the module's dtype, as Horovod's Lightning estimator gave
them. Without ``data_module`` the batches come from the materialized DataFrame (each rank
its share, the same number of steps on every rank); with one, Lightning reads it (each
rank its DistributedSampler share) and the DataFrame given to ``fit`` is only sampled to
check the module's forward pass, which ``transform`` uses. Every epoch rank 0 stores
Lightning's own checkpoint in the run; fitting with an existing ``run_id`` resumes from
it (epoch, optimizer, LR schedulers, callbacks). A ``ModelCheckpoint`` among the
callbacks decides the returned model (its best), as in Horovod.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from hora.errors import ConfigError
from hora.estimators.data.frames import hint_grouping
from hora.estimators.framework import CheckResult, Framework, Resume, TrainingSession, register
from hora.estimators.params import EstimatorConfig, param
from hora.estimators.spec import freeze, thaw
from hora.estimators.frameworks.torch.codec import TorchCodec
from hora.estimators.frameworks.torch.tensors import _stack, _tensor, as_outputs, state_bytes, to_inputs

logger = logging.getLogger(__name__)

_PACKAGES = ("lightning", "pytorch_lightning")
_IGNORED = "Horovod's Lightning data-loader knob; hora's reader needs none: "


def is_lightning_object(obj: Any) -> bool:
    """Whether ``obj``'s class comes from Lightning (either import name), without importing it."""
    return any(k.__module__.split(".")[0] in _PACKAGES for k in type(obj).__mro__)


@dataclass
class LightningConfig(EstimatorConfig):
    """The Lightning estimator's parameters: the shared ones and Lightning's."""

    trainer_args: dict | None = param(None, "further Lightning Trainer arguments (accumulate_grad_batches, "
                                      "gradient_clip_val, precision, ...; strategy: Lightning's sharded "
                                      "ModelParallelStrategy or FSDPStrategy)", "pickle")
    data_module: Any = param(None, "a LightningDataModule to train on instead of the DataFrame", "pickle")
    logger: Any = param(None, "Lightning logger(s): TensorBoardLogger, CSVLogger, MLFlowLogger, ...", "pickle")
    profiler: Any = param(None, "Lightning profiler (e.g. 'simple')", "pickle")
    terminate_on_nan: bool = param(False, "raise when a training loss is NaN or infinite")
    log_every_n_steps: int | None = param(None, "how often Lightning logs within an epoch")
    num_gpus: int | None = param(None, "ignored (Horovod's)", ignored="Horovod's GPU count; hora trains one GPU per "
                                 "rank with use_gpu=True")
    loader_num_epochs: int | None = param(None, "ignored (Horovod's data-loader knob)", ignored=_IGNORED + "each "
                                          "epoch reads its batches anew")
    debug_data_loader: bool | None = param(None, "ignored (Horovod's data-loader knob)", ignored=_IGNORED + "set "
                                           "logging to DEBUG for hora.store")
    train_async_data_loader_queue_size: int | None = param(None, "ignored (Horovod's data-loader knob)",
                                                           ignored=_IGNORED + "it prefetches in one thread")
    val_async_data_loader_queue_size: int | None = param(None, "ignored (Horovod's data-loader knob)",
                                                         ignored=_IGNORED + "it prefetches in one thread")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._wrap_plain_module()
        owned = {"optimizer": "the module's configure_optimizers gives the optimizer",
                 "loss": "the module's training_step computes the loss",
                 "metrics": "log metrics with self.log in the module's steps",
                 "learning_rate": "the module's configure_optimizers sets the learning rate"}
        for name, why in owned.items():
            if getattr(self, name) is not None:
                raise ConfigError(f"{name}= does not apply to a LightningModule: {why}")
        if self.backward_passes_per_step != 1:
            raise ConfigError("backward_passes_per_step does not apply to Lightning: pass "
                              f"trainer_args={{'accumulate_grad_batches': {self.backward_passes_per_step}}}")
        if self.trainer_args is not None and not isinstance(self.trainer_args, dict):
            raise ConfigError(f"trainer_args must be a dict of Lightning Trainer arguments, got {self.trainer_args!r}")
        if not isinstance(self.terminate_on_nan, bool):
            raise ConfigError(f"terminate_on_nan must be True or False, got {self.terminate_on_nan!r}")

    def _is_plain(self) -> bool:
        """A plain torch module (not a LightningModule): Horovod's legacy path, given with optimizer= and loss=."""
        return self.model is not None and not is_lightning_object(self.model)

    def _wrap_plain_module(self) -> None:
        """Wrap a plain torch module with its optimizer and loss as a LightningModule (Horovod's legacy path,
        :func:`hora.lightning.plain_module.to_lightning_module`); the estimator's Params keep the plain module."""
        if not self._is_plain():
            return
        import torch

        if not isinstance(self.model, torch.nn.Module):
            raise ConfigError(f"model must be a LightningModule, or a torch.nn.Module with optimizer= and loss=, got "
                              f"{type(self.model).__name__}")
        from hora.lightning._compat import flavor_name_of
        from hora.lightning.plain_module import to_lightning_module

        hints = [*(self.callbacks or []), *(self.logger if isinstance(self.logger, (list, tuple)) else [self.logger])]
        package = next((flavor_name_of(h) for h in hints if h is not None and flavor_name_of(h)), None)
        self.model = to_lightning_module(self.model, self.optimizer, self.loss, self.loss_weights,
                                         self.features.keys, self.label_cols, self.sample_weight_col,
                                         package=package)
        self.optimizer = self.loss = self.loss_weights = None

    def needs_optimizer(self) -> bool:
        return self._is_plain()

    def needs_loss(self) -> bool:
        return self._is_plain()

    @classmethod
    def accepts_callback(cls, cb: Any) -> bool:
        return super().accepts_callback(cb) or is_lightning_object(cb)

    @classmethod
    def callback_kinds(cls) -> str:
        return "hora.estimators.callbacks.Callback or Lightning Callback instances"

    def lightning_callbacks(self) -> list[Any]:
        """The Lightning callbacks among ``callbacks``."""
        return [cb for cb in self.callbacks or [] if is_lightning_object(cb)]

    def trainer_kwargs(self) -> dict[str, Any]:
        """``trainer_args`` with this config's Trainer-level parameters folded in (``max_epochs`` from ``epochs``)."""
        args = dict(self.trainer_args or {})
        args.setdefault("max_epochs", self.epochs)
        if self.profiler is not None:
            args.setdefault("profiler", self.profiler)
        if self.log_every_n_steps is not None:
            args.setdefault("log_every_n_steps", self.log_every_n_steps)
        args.setdefault("accelerator", "gpu" if self.use_gpu else "cpu")
        return args


class LightningCodec(TorchCodec):
    """Driver side of Lightning: Lightning's checks, then the Torch codec (a LightningModule is a torch.nn.Module)."""

    name = "lightning"
    checkpoint_state_key = "state_dict"  # the run's checkpoints are Lightning's own

    def check(self, config: Any, sample: dict[str, np.ndarray]) -> CheckResult:
        import torch

        from hora.lightning.validate import validate_trainer_args

        module = config.model
        validate_trainer_args(module, config.trainer_kwargs(), callbacks=config.lightning_callbacks(),
                              loggers=config.logger, data_module=config.data_module)
        _check_sharded(config)
        features = config.features
        inputs = to_inputs(module, [sample[k] for k in features.keys], config.input_shapes)
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad():
                raw = module(*inputs)
        except Exception as exc:
            shapes = [tuple(t.shape) for t in inputs]
            hint = hint_grouping(features) if isinstance(exc, TypeError) else ""
            raise ConfigError(
                f"the LightningModule's forward failed on a sample of the data (inputs of shapes {shapes} from "
                f"feature_cols {config.feature_cols}; transform calls forward with one tensor per entry): "
                f"{type(exc).__name__}: {exc}{hint}"
            ) from exc
        finally:
            module.train(was_training)
        outs = as_outputs(raw, len(config.label_cols))
        return CheckResult(output_shapes=[tuple(int(d) for d in o.shape[1:]) for o in outs])

    def trains_on_frame(self, config: Any) -> bool:
        return config.data_module is None

    def freeze(self, config: Any) -> bytes:
        loggers = config.logger
        return freeze({"model": config.model, "trainer_args": config.trainer_kwargs(),
                       "callbacks": config.lightning_callbacks(), "loggers": loggers, "data_module": config.data_module,
                       "compression": config.gradient_compression})


@dataclass
class LightningSession(TrainingSession):
    """One rank's Lightning run: the module and what its Trainer gets, as attributes."""

    drives_loop = True

    module: Any
    feature_keys: tuple
    label_cols: tuple
    sample_weight_col: str | None
    input_shapes: Any
    trainer_args: dict
    callbacks: list = field(default_factory=list)
    loggers: Any = None
    data_module: Any = None
    compression: Any = None

    @classmethod
    def open(cls, spec: Any) -> "LightningSession":
        import torch

        import hora.native as hn

        config = spec.config
        hn.init()
        if not config.use_gpu:
            from hora.estimators.devices import set_rank_threads

            set_rank_threads(hn.local_size())  # its share of the host's cores, not all of them
        torch.manual_seed(config.seed)
        np.random.seed(config.seed % (2**32))
        payload = thaw(spec.payload)
        return cls(module=payload["model"], feature_keys=tuple(config.features.keys),
                   label_cols=tuple(config.label_cols), sample_weight_col=config.sample_weight_col,
                   input_shapes=config.input_shapes, trainer_args=dict(payload["trainer_args"]),
                   callbacks=list(payload["callbacks"]), loggers=payload["loggers"],
                   data_module=payload["data_module"], compression=payload["compression"])

    def batches(self, reader: Any, transform: Any) -> Iterator[dict[str, Any]]:
        """One pass of ``reader`` as Lightning batches: a dict of tensors by column (features shaped for the module)."""
        source = reader if transform is None else (transform(b) for b in reader)
        for batch in source:
            out = dict(zip(self.feature_keys, to_inputs(self.module, [batch[k] for k in self.feature_keys],
                                                        self.input_shapes)))
            for name in (*self.label_cols, *([self.sample_weight_col] if self.sample_weight_col else [])):
                out[name] = _tensor(_stack(batch[name]))
            yield out

    def fit_run(self, run: Any) -> dict[str, Any] | None:
        """Lightning's loop over this rank's batches, with the run's checkpoints, callbacks and history."""
        from hora.lightning._compat import flavor_of_module
        from hora.lightning.fit import fit_module

        spec = run.spec
        latest = run.latest_checkpoint()
        if latest is not None and spec.store.exists(spec.store.layout.history_path(spec.run_id)):
            saved = spec.store.read_json(spec.store.layout.history_path(spec.run_id))
            run.history = [h for h in saved if h.get("epoch", 0) <= latest[0]]
        run.train_begin()
        on_frame = self.data_module is None
        starts = _epoch_starts(flavor_of_module(self.module), run, own_data=not on_frame)
        work_dir = tempfile.mkdtemp(prefix="hora-lightning-run-")
        try:
            result = fit_module(
                self.module,
                (lambda epoch: run.batches("train", epoch)) if on_frame else None,
                (lambda epoch: run.batches("val", epoch)) if on_frame and spec.has_val else None,
                trainer_args=self.trainer_args, callbacks=[*self.callbacks, starts],
                loggers=self.loggers if self.loggers is not None else _default_logger(self.module, spec),
                data_module=self.data_module, ckpt_bytes=latest[1] if latest is not None else None,
                on_epoch_end=lambda ev: run.epoch_end(ev.epoch, dict(ev.metrics), lambda: ev.checkpoint),
                on_batch_end=lambda be: run.batch_end(be.epoch, be.batch, be.loss),
                train_steps=run.steps("train") or None if on_frame else None,
                val_steps=run.steps("val") or None if on_frame else None, work_dir=work_dir,
                scale_lr=spec.config.lr_scaling == "linear", terminate_on_nan=spec.config.terminate_on_nan,
                distributed_optimizer_kwargs={"compression": self.compression} if self.compression else None,
                quiet=spec.config.verbose <= 1)  # the driver's console tells the epochs
            run.history, run.start_epoch = _with_data_wait(result.history, run.history), result.start_epoch
            self.global_step = result.global_step
            if run.rank == 0:
                if self.trainer_args.get("strategy") is not None:  # sharded: the model whole again, on rank 0
                    self.module = thaw(spec.payload)["model"]
                    self.module.load_state_dict(result.state_dict)
                self._load_best()
        finally:
            shutil.rmtree(work_dir, ignore_errors=True)
        run.train_end()
        return run.result()

    def _load_best(self) -> None:
        """A ModelCheckpoint among the callbacks decides the returned model (its best file), as in Horovod."""
        import torch

        for cb in self.callbacks:
            path = getattr(cb, "best_model_path", None)
            if path and os.path.exists(path):
                state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
                self.module.load_state_dict(state)
                logger.info("the fitted model is %s's best checkpoint %s", type(cb).__name__, path)
                return

    def checkpoint(self, resume: Resume) -> bytes:
        """The module's weights (what BestModelCheckpoint keeps; the run's checkpoints are Lightning's own)."""
        return self.weights()

    def restore(self, data: bytes, ckpt_epoch: int) -> Resume:
        import torch

        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        self.module.load_state_dict(state.get("state_dict", state) if isinstance(state, dict) else state)
        return Resume(epoch=ckpt_epoch + 1)

    def weights(self) -> bytes:
        return state_bytes(self.module)

    def model_files(self) -> dict[str, bytes]:
        return LightningCodec().serialize(self.module)


def _default_logger(module: Any, spec: Any) -> Any:
    """Without ``logger=``, a TensorBoardLogger writing to the run's logs folder in the store (as Horovod's
    estimator did), so that ``self.log`` and callbacks such as ``LearningRateMonitor`` have a logger."""
    from hora.lightning._compat import flavor_of_module

    store = spec.store
    logs = store.layout.logs_dir(spec.run_id)
    if store.is_local:
        os.makedirs(logs, exist_ok=True)
        save_dir = logs
    else:
        save_dir = store.url_for(logs)
    return flavor_of_module(module).sub("loggers").TensorBoardLogger(save_dir=save_dir, name="", version="")


def _check_sharded(config: Any) -> None:
    """Driver-side checks of one of Lightning's sharded strategies in ``trainer_args``.

    Raises:
        ConfigError: ``FSDPStrategy`` on CPU ranks, ``ModelParallelStrategy`` without
            ``configure_model``, or ``gradient_compression`` (hora's allreduce is not used).
    """
    from hora.lightning._compat import flavor_of_module
    from hora.lightning.sharded import check_sharded_strategy

    strategy = (config.trainer_args or {}).get("strategy")
    if strategy is None:
        return
    name = check_sharded_strategy(strategy, flavor_of_module(config.model), config.model, use_gpu=bool(config.use_gpu))
    if config.gradient_compression is not None:
        raise ConfigError(f"gradient_compression applies to hora's allreduce; with Lightning's {name} the gradients "
                          "are reduced by torch.distributed: remove gradient_compression")
    if config.lr_scaling == "linear" and config.num_proc not in (None, 1):
        logger.warning("lr_scaling='linear' does not apply under Lightning's %s: the learning rate is used as "
                       "configure_optimizers sets it", name)


def _epoch_starts(flavor: Any, run: Any, own_data: bool = False) -> Any:
    """A Lightning callback calling the run's ``epoch_begin`` (hora callbacks' ``on_epoch_begin``);
    with ``own_data`` (a ``data_module``: Lightning reads the batches, not the run) it also times the
    gaps between the steps as the epoch's data wait (:meth:`hora.estimators.worker.feed.DataWait.step_begins`)."""
    base = flavor.sub("callbacks").Callback

    class _EpochStarts(base):  # type: ignore[misc, valid-type]
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            run.epoch_begin(int(trainer.current_epoch))
            if own_data:
                run.feed.epoch_starts(int(trainer.current_epoch))

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if own_data:
                run.feed.step_begins()

    return _EpochStarts()


def _with_data_wait(history: list[dict[str, Any]], recorded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Lightning's epoch history with each epoch's ``data_wait`` as the run recorded it."""
    waits = {h.get("epoch"): h["data_wait"] for h in recorded if "data_wait" in h}
    return [{**h, "data_wait": waits[h.get("epoch")]} if h.get("epoch") in waits else h for h in history]


LIGHTNING = register(Framework(name="lightning", codec=LightningCodec(), session=LightningSession,
                               config=LightningConfig, model_kind="a LightningModule", modules=("torch",)))

__all__ = ["LIGHTNING", "LightningConfig", "LightningCodec", "LightningSession", "is_lightning_object"]
