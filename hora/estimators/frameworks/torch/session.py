"""PyTorch's rank side on the estimator seam: :class:`TorchSession`, one rank's training of a
``TorchEstimator`` fit (the default step, the loop options, strategies, checkpoints); the
driver side (:class:`~hora.estimators.frameworks.torch.codec.TorchCodec`, the parameters) is in
:mod:`hora.estimators.frameworks.torch.codec`, whose module docstring has the conventions users see.
"""

from __future__ import annotations

import copy
import io
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from hora.errors import ConfigError, DataError
from hora.estimators.frameworks.torch import strategies as torch_strategies
from hora.estimators.worker.feed import DeviceFeed, Fed
from hora.estimators.framework import Resume, TrainingSession
from hora.estimators.spec import freeze, thaw
from hora.estimators.frameworks.torch.strategies import COLLECTIVE_CHECKPOINT, TORCH_DISTRIBUTED
from hora.estimators.frameworks.torch.tensors import (
    LabelConverter, ParamDtype, _stack, _tensor, align_label, as_outputs, first_state_mismatch, is_torchmetric,
    loss_value, normalize_metrics, per_row_loss_fn, state_bytes, to_inputs, weighted,
)

logger = logging.getLogger(__name__)


def serialize_model(model: Any) -> dict[str, bytes]:
    """A torch model as a saved hora model holds it: the pickled module and its weights."""
    return {"model.pkl": freeze(model), "weights.pt": state_bytes(model)}


def class_weight_list(cw: Any, classes: int) -> list[float] | None:
    """``class_weight`` (a dict or a list) as one weight per class (None for None).

    Raises:
        ConfigError: a class index beyond ``classes``, or a list of another length.
    """
    if cw is None:
        return None
    if isinstance(cw, dict):
        beyond = [k for k in cw if k >= classes]
        if beyond:
            raise ConfigError(f"class_weight names class(es) {beyond}, but the model has {classes} classes")
        return [float(cw.get(i, 1.0)) for i in range(classes)]
    if len(cw) != classes:
        raise ConfigError(f"class_weight has {len(cw)} weights, but the model has {classes} classes")
    return [float(w) for w in cw]


def classes_of(output_shape: Sequence[int]) -> int:
    """The number of classes of a classifier's per-row output shape (one score: 2)."""
    shape = tuple(output_shape)
    return 2 if shape in ((), (1,)) else int(shape[-1])


@dataclass
class TorchSession(TrainingSession):
    """One torch rank's run: model, DistributedOptimizer, losses and metrics as attributes."""

    hvd: Any
    model: Any
    optimizer: Any
    losses: list
    metrics: list  # (key, metric, label index): stateful metrics get one copy per label
    feature_keys: tuple
    label_cols: tuple
    sample_weight_col: str | None = None
    input_shapes: Any = None
    loss_weights: list = field(default_factory=list)
    device: Any = None
    backward_passes_per_step: int = 1
    minibatch_fn: Callable | None = None
    #: the options of the loop: the scheduler and when it steps, autocast's dtype (None: fp32), the
    #: GradScaler (float16), the clipping bounds, one weight per class (a tensor) or None
    scheduler: Any = None
    scheduler_interval: str = "epoch"
    autocast_dtype: Any = None
    scaler: Any = None
    clip_norm: float | None = None
    clip_value: float | None = None
    class_weights: Any = None
    #: task='causal_lm': no label column, the model's own loss on its input ids; history adds perplexity
    causal_lm: bool = False
    #: ``strategy=`` (see :mod:`hora.estimators.frameworks.torch.strategies`); the module the training forward
    #: pass runs (DDP's wrapper; else the model); sharded strategies: every rank takes part in a
    #: checkpoint; fsdp: the fit's payload (a plain copy of the model for the result) and that copy
    strategy: str = "hora"
    forward_module: Any = None
    checkpoint_collective: bool = False
    template: bytes | None = None
    _final: Any = None
    _evaluating: bool = False
    metric_rows: int = 0
    pending: bool = False  # gradients computed since the last optimizer step (train_minibatch_fn)
    #: seconds of the default step's parts, summed over the run (the worker's epoch profile)
    step_seconds: dict = field(default_factory=lambda: {"forward+loss": 0.0, "backward": 0.0, "optimizer": 0.0})
    _hooks: list = field(default_factory=list)
    #: the model's parameter dtype, kept between steps (see :class:`~hora.estimators.frameworks.torch.tensors.ParamDtype`)
    _dtype: Any = field(default=None, init=False, repr=False)
    #: one per label column: its batches as tensors aligned to the model's output, the rule kept between steps
    _label_converters: list = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.forward_module is None:
            self.forward_module = self.model
        self._dtype = ParamDtype(self.model)
        self._label_converters = [LabelConverter(name, self.device) for name in self.label_cols]

    @classmethod
    def open(cls, spec: Any) -> "TorchSession":
        import torch

        import hora.torch as hvd

        config = spec.config
        if not hvd.is_initialized():
            hvd.init()
        if not config.use_gpu:
            from hora.estimators.devices import set_rank_threads

            set_rank_threads(hvd.local_size())  # its share of the host's cores, not all of them
        torch.manual_seed(config.seed)
        np.random.seed(config.seed % (2**32))
        payload = thaw(spec.payload)
        model, opt = payload["model"], payload["optimizer"]
        if not isinstance(opt, torch.optim.Optimizer):
            opt = opt(model.parameters())
        device = None
        if config.use_gpu:
            from hora.estimators.devices import rank_device

            # local rank / CUDA_VISIBLE_DEVICES / the Spark task's GPU: more ranks than GPUs is an error
            device = rank_device(hvd.rank(), hvd.local_rank(), hvd.local_size())
            model.to(device)  # moves parameters in place: the optimizer stays bound
        scale = hvd.size() if config.lr_scaling == "linear" else 1
        for group in opt.param_groups:
            if config.learning_rate is not None:
                group["lr"] = config.learning_rate
            if "lr" in group:
                group["lr"] = group["lr"] * scale
                group.setdefault("initial_lr", group["lr"])
        kwargs: dict[str, Any] = {"backward_passes_per_step": config.backward_passes_per_step}
        if payload["compression"] is not None:
            kwargs["compression"] = payload["compression"]
        strategy = getattr(config, "strategy", "hora")
        forward_module, opt = torch_strategies.prepare(strategy, hvd, model, opt, kwargs)
        labels = tuple(config.label_cols)
        loss = payload["loss"]
        causal = config.task == "causal_lm"
        losses = list(loss) if isinstance(loss, (list, tuple)) else [loss] * max(len(labels), 1 if causal else 0)
        if config.sample_weight_col is not None or payload.get("class_weight") is not None:
            losses = [per_row_loss_fn(fn) for fn in losses]
        metrics = []
        for mname, m in normalize_metrics(payload["metrics"]):
            for i, label in enumerate(labels):
                key = mname if len(labels) == 1 else f"{label}_{mname}"
                mi = copy.deepcopy(m) if (len(labels) > 1 and is_torchmetric(m)) else m
                if device is not None and is_torchmetric(mi) and hasattr(mi, "to"):
                    mi = mi.to(device)
                metrics.append((key, mi, i))
        class_weights = None
        if payload.get("class_weight") is not None:
            weights = class_weight_list(payload["class_weight"], classes_of(spec.output_shapes[0]))
            class_weights = torch.tensor(weights, dtype=torch.float32, device=device)
        precision = getattr(config, "precision", "32")
        autocast_dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
        # float16's GradScaler on the rank's device (the CPU's since torch 2.3: TorchConfig checks it)
        scaler = torch.amp.GradScaler(device.type if device is not None else "cpu") if precision == "16-mixed" else None
        session = cls(hvd=hvd, model=model, optimizer=opt, losses=losses, metrics=metrics,
                      feature_keys=tuple(config.features.keys), label_cols=labels,
                      sample_weight_col=config.sample_weight_col, input_shapes=config.input_shapes,
                      loss_weights=list(config.loss_weights) if config.loss_weights else [1.0] * len(labels),
                      device=device, backward_passes_per_step=config.backward_passes_per_step,
                      minibatch_fn=payload.get("minibatch_fn"),
                      scheduler=payload["lr_scheduler"](opt) if payload.get("lr_scheduler") is not None else None,
                      scheduler_interval=getattr(config, "lr_scheduler_interval", "epoch"),
                      autocast_dtype=autocast_dtype, scaler=scaler,
                      clip_norm=getattr(config, "gradient_clip_norm", None),
                      clip_value=getattr(config, "gradient_clip_value", None), class_weights=class_weights,
                      causal_lm=causal,
                      strategy=strategy, forward_module=forward_module,
                      checkpoint_collective=strategy in COLLECTIVE_CHECKPOINT,
                      template=spec.payload if strategy == "fsdp" else None)
        if session.minibatch_fn is not None:
            session._track_pending()
        return session

    def _track_pending(self) -> None:
        def grads_in(_param: Any) -> None:
            self.pending = True

        def stepped(*_args: Any) -> None:
            self.pending = False

        self._hooks.append(self.optimizer.register_step_post_hook(stepped))
        for p in self.model.parameters():
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(grads_in))

    def _prepare(self, batch: dict[str, np.ndarray]) -> tuple[list, list, Any]:
        """Inputs, labels (not aligned yet) and weights of a batch, as tensors (``train_minibatch_fn``'s)."""
        inputs = self._inputs(batch)
        labels = [_tensor(_stack(batch[name])) for name in self.label_cols]
        weights = _tensor(batch[self.sample_weight_col]) if self.sample_weight_col is not None else None
        if self.device is not None:
            labels = [t.to(self.device) for t in labels]
            weights = weights.to(self.device) if weights is not None else None
        return inputs, labels, weights

    def _align(self, outputs: Any, labels: list) -> tuple[list, list]:
        outs = as_outputs(outputs, len(self.label_cols))
        return outs, [align_label(o, t, name) for o, t, name in zip(outs, labels, self.label_cols)]

    def _loss(self, outs: list, labels: list, weights: Any) -> Any:
        if self.class_weights is not None:  # a classifier (one label): each row weighted by its class
            by_class = self.class_weights[labels[0].reshape(-1).long()]
            weights = by_class if weights is None else weights.to(by_class.dtype).reshape(-1) * by_class
        total = None
        for i, (out, label) in enumerate(zip(outs, labels)):
            value = self.losses[i](out, label)
            if weights is not None:
                value = weighted(value, weights)
            w = self.loss_weights[i]
            if w != 1.0:  # (a weight of 1 would add a node to the graph for nothing, every step)
                value = value * w
            total = value if total is None else total + value
        return total

    def _inputs(self, batch: dict[str, np.ndarray]) -> list:
        return to_inputs(self.model, [batch[k] for k in self.feature_keys], self.input_shapes, self.device,
                         dtype=self._dtype())

    def _forward_loss(self, batch: dict[str, np.ndarray]) -> tuple[Any, list, list]:
        """The loss of a batch, with the outputs and aligned labels: :meth:`_prepare`, the forward
        pass, :meth:`_align` and :meth:`_loss`, the labels made by the session's
        :class:`~hora.estimators.frameworks.torch.tensors.LabelConverter` s (the same tensors, without
        deciding again per batch what aligning them takes)."""
        inputs, converted, weights = self._tensors(batch)
        module = self.model if self._evaluating else self.forward_module  # (DDP syncs in training only)
        if getattr(self.model, "takes_labels", False):  # a Hugging Face model's own loss (hora.estimators.frameworks.torch.hf)
            self.model.pending_labels = converted[0][0]
        with self._autocast():
            return self._aligned_loss(module(*inputs), converted, weights)

    def _autocast(self) -> Any:
        """``torch.autocast`` to the ``precision``'s dtype on the session's device (a no-op context for '32')."""
        import contextlib

        import torch

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        kind = self.device.type if self.device is not None else "cpu"
        return torch.autocast(device_type=kind, dtype=self.autocast_dtype)

    def batches(self, reader: Any, transform: Any) -> Any:
        """The numpy batches (the default hook); on a CUDA rank through a :class:`~hora.estimators.worker.feed.DeviceFeed`:
        a feed thread makes each batch's tensors (:meth:`_host_tensors`), pinned, and copies them to
        the device on a side stream one batch ahead. Not with ``train_minibatch_fn`` (its batches are
        made in the step)."""
        source = super().batches(reader, transform)
        if self.device is None or self.device.type != "cuda" or self.minibatch_fn is not None:
            return source
        import hora.native as hn

        name = f"rank {hn.rank()}" if hn.is_initialized() else "the rank"
        return DeviceFeed(self.device, name=name).batches(source, self._host_tensors)

    def _host_tensors(self, batch: dict[str, np.ndarray]) -> tuple[list, Any]:
        """:meth:`_tensors` of a batch on the CPU (the feed copies them): ``(tensors, (inputs, labels))``."""
        inputs = to_inputs(self.model, [batch[k] for k in self.feature_keys], self.input_shapes, None,
                           dtype=self._dtype())
        labels = [conv.tensor(batch[name], host=True) for conv, name in zip(self._label_converters, self.label_cols)]
        weights = _tensor(batch[self.sample_weight_col]) if self.sample_weight_col is not None else None
        return [*inputs, *(t for t, _, _ in labels), weights], (len(inputs), labels)

    def _tensors(self, batch: Any) -> tuple[list, list, Any]:
        """What the forward pass and the loss need of a batch, before the forward pass: inputs,
        labels (:meth:`LabelConverter.tensor`), weights (a :class:`~hora.estimators.worker.feed.Fed` batch:
        already on the device)."""
        if isinstance(batch, Fed):
            n, labels = batch.extra
            on_device = batch.tensors
            converted = [(t, arr, kept) for t, (_, arr, kept) in zip(on_device[n:n + len(labels)], labels)]
            return on_device[:n], converted, on_device[-1]
        inputs = self._inputs(batch)
        converted = [conv.tensor(batch[name]) for conv, name in zip(self._label_converters, self.label_cols)]
        weights = _tensor(batch[self.sample_weight_col]) if self.sample_weight_col is not None else None
        if weights is not None and self.device is not None:
            weights = weights.to(self.device)
        return inputs, converted, weights

    def _aligned_loss(self, raw: Any, converted: list, weights: Any) -> tuple[Any, list, list]:
        if self.causal_lm:  # the logits; the model's loss on its input ids (hora.estimators.frameworks.torch.hf)
            outs = as_outputs(raw, 1)
            return self.losses[0](outs[0], None), outs, []
        outs = as_outputs(raw, len(self.label_cols))
        labels = [conv.align(out, c) for conv, out, c in zip(self._label_converters, outs, converted)]
        return self._loss(outs, labels, weights), outs, labels

    def train_step(self, batch: dict[str, np.ndarray], step: int) -> float:
        k = self.backward_passes_per_step
        if self.minibatch_fn is not None:
            inputs, labels, weights = self._prepare(batch)
            _, loss = self.minibatch_fn(self.forward_module, self.optimizer, self._align, self._loss, inputs, labels,
                                        weights, k, step)
        else:
            clock = time.perf_counter
            t0 = clock()
            if step % k == 0:
                self.optimizer.zero_grad()
            loss, _, _ = self._forward_loss(batch)
            t1 = clock()
            scaled = loss / k if k > 1 else loss
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            t2 = clock()
            if (step + 1) % k == 0:
                self._optimizer_step()
            seconds = self.step_seconds
            seconds["forward+loss"] += t1 - t0
            seconds["backward"] += t2 - t1
            seconds["optimizer"] += clock() - t2
        if self.scheduler is not None and self.scheduler_interval == "step" and (
                self.minibatch_fn is not None or (step + 1) % k == 0):
            self.scheduler.step()
        value = loss_value(loss)
        if not math.isfinite(value):
            raise DataError(f"training loss became {value} at step {step} on rank {self.rank}")
        return value

    def _optimizer_step(self) -> None:
        """One optimizer step on the allreduced gradients; with clipping or a GradScaler, Horovod's
        pattern: ``synchronize()``, unscale, clip, then ``step()`` inside ``skip_synchronize()``."""
        import torch

        if self.scaler is None and self.clip_norm is None and self.clip_value is None:
            self.optimizer.step()
            return
        if self.strategy in TORCH_DISTRIBUTED:  # torch's optimizer: the gradients are reduced by backward
            self._clip_and_step()
            return
        self.optimizer.synchronize()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        if self.clip_value is not None:
            torch.nn.utils.clip_grad_value_(params, self.clip_value)
        if self.clip_norm is not None:
            if self.checkpoint_collective:  # sharded: the norm of every rank's shard of the gradients
                self.optimizer.clip_grad_norm_(self.clip_norm)
            else:
                torch.nn.utils.clip_grad_norm_(params, self.clip_norm)
        with self.optimizer.skip_synchronize():
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()

    def _clip_and_step(self) -> None:
        """:meth:`_optimizer_step` for DDP and FSDP: unscale, clip (FSDP's DTensor gradients: the
        norm of the whole model), step."""
        import torch

        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        if self.clip_value is not None:
            torch.nn.utils.clip_grad_value_(params, self.clip_value)
        if self.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, self.clip_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def finish_epoch(self, steps: int) -> None:
        if self.minibatch_fn is not None:
            if self.pending:
                self.optimizer.step()  # the last window of a Horovod-style minibatch function
        elif steps % self.backward_passes_per_step:
            self._optimizer_step()  # the partial accumulation window (step() reduces what is pending)
            if self.scheduler is not None and self.scheduler_interval == "step":
                self.scheduler.step()

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> bool:
        """Steps an epoch-interval ``lr_scheduler`` (``ReduceLROnPlateau`` with ``val_loss``, else ``loss``),
        before the epoch's checkpoint holds its state."""
        if self.causal_lm:  # exp of the mean token loss (the model's loss averages the batch's tokens)
            for key in ("loss", "val_loss"):
                if key in logs:
                    logs[key.replace("loss", "perplexity")] = _perplexity(logs[key])
        if self.scheduler is not None and self.scheduler_interval == "epoch":
            import torch

            if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                self.scheduler.step(logs.get("val_loss", logs.get("loss")))
            else:
                self.scheduler.step()
        return False

    def eval_keys(self) -> list[str]:
        return ["loss", "_n"] + [key for key, _, _ in self.metrics]

    def eval_batch(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        import torch

        with torch.no_grad():  # (the forward pass under the precision's autocast, as in training)
            loss, outs, labels = self._forward_loss(batch)
            n = int(outs[0].shape[0])
            result = {"loss": float(loss) * n, "_n": float(n)}
            for key, m, i in self.metrics:
                if is_torchmetric(m):
                    m.update(outs[i], labels[i])
                else:
                    result[key] = float(torch.as_tensor(m(outs[i], labels[i])).float().mean()) * n
            self.metric_rows += n
        return result

    def eval_finish(self) -> dict[str, float]:
        out: dict[str, float] = {}
        rows, self.metric_rows = self.metric_rows, 0
        # on torch.distributed's group (ddp, fsdp) torchmetrics' compute() syncs across the ranks (it
        # gives every rank the whole value): every rank calls it, one without validation rows too
        synced = self.strategy in TORCH_DISTRIBUTED
        for key, m, _ in self.metrics:
            if is_torchmetric(m):
                if rows or synced:
                    value = m.compute() if rows else _quiet_compute(m)
                    out[key] = float(value.float().mean()) * rows
                m.reset()
        return out

    def set_train(self, training: bool) -> None:
        self.model.train(training)
        if self._evaluating == training:  # a change (the loop sets training at every epoch's start)
            self._evaluating = not training
            torch_strategies.evaluating(self.strategy, self.model, self._evaluating)

    def broadcast_initial(self) -> None:
        if self.strategy == "fsdp":  # every rank sharded the same model and loaded the same checkpoint
            return
        self.hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        self.hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)

    def checkpoint(self, resume: Resume) -> bytes:
        import torch

        buf = io.BytesIO()
        kind = torch_strategies.SHARDED_CHECKPOINT.get(self.strategy) if self.checkpoint_location else None
        if kind is not None:
            # every rank writes its shards beside the run's checkpoints (nothing gathered); what
            # rank 0 commits names the folder (and, for ZeRO, holds the weights: the same on every rank)
            store, run_id, attempt = self.checkpoint_location
            folder = torch_strategies.shard_folder(kind, resume.epoch, resume.step, resume.global_step, attempt)
            path = f"{store.layout.checkpoint_dir(run_id)}/{folder}"
            if kind == "dcp":
                torch_strategies.save_dcp(self.model, self.optimizer, store, path)
                state: dict[str, Any] = {"dcp": folder, "extra": resume.to_meta()}
            else:
                torch_strategies.save_zero(self.optimizer, store, path)
                state = {"zero": folder, "model": self.model.state_dict(), "extra": resume.to_meta()}
        else:
            # the whole state in torch's format: any strategy and any number of ranks loads it
            model_state, optimizer = torch_strategies.full_state(self.strategy, self.model, self.optimizer)
            state = {"model": model_state, "optimizer": optimizer, "extra": resume.to_meta()}
        if self.scheduler is not None:
            state["lr_scheduler"] = self.scheduler.state_dict()
        if self.scaler is not None:
            state["grad_scaler"] = self.scaler.state_dict()
        torch.save(state, buf)
        return buf.getvalue()

    def rescale_learning_rate(self, factor: float) -> None:
        for group in self.optimizer.param_groups:
            if "lr" in group:
                group["lr"] = group["lr"] * factor
            if "initial_lr" in group:
                group["initial_lr"] = group["initial_lr"] * factor
        if self.scheduler is not None and hasattr(self.scheduler, "base_lrs"):  # the schedule follows the size
            self.scheduler.base_lrs = [lr * factor for lr in self.scheduler.base_lrs]

    def restore(self, data: bytes, ckpt_epoch: int) -> Resume:
        import torch

        ckpt = torch.load(io.BytesIO(data), map_location=self.device or "cpu", weights_only=False)
        where = f"the checkpoint of epoch {ckpt_epoch}"
        kind = next((k for k in ("dcp", "zero") if k in ckpt), None)  # written as shards (see torch_strategies)
        if kind is not None:
            if self.checkpoint_location is None:
                raise ConfigError(f"{where} is written as shards in the run's folder; it is read through the run's "
                                  "store")
            store, run_id, _ = self.checkpoint_location
            path = f"{store.layout.checkpoint_dir(run_id)}/{ckpt[kind]}"
        if kind == "dcp":
            if self.strategy == "fsdp":
                torch_strategies.load_dcp(self.model, self.optimizer, store, path, where)
            else:
                ckpt["model"], ckpt["optimizer"] = torch_strategies.load_dcp_whole(store, path)
        if "model" in ckpt:  # before a ZeRO run's shards are read: name the parameter, not a shard file
            mismatch = first_state_mismatch(self.model.state_dict(), ckpt["model"])
            if mismatch is not None:
                raise ConfigError(f"{where} belongs to another model: {mismatch}")
        if kind == "zero":
            ckpt["optimizer"] = torch_strategies.load_zero(self.optimizer, self.strategy, store, path)
        torch_strategies.load_state(self.strategy, self.model, self.optimizer, ckpt.get("model"),
                                    ckpt.get("optimizer"))
        if self.scheduler is not None and "lr_scheduler" in ckpt:
            self.scheduler.load_state_dict(ckpt["lr_scheduler"])
        if self.scaler is not None and "grad_scaler" in ckpt:
            self.scaler.load_state_dict(ckpt["grad_scaler"])
        return Resume.from_meta(dict(ckpt.get("extra", {})), ckpt_epoch)

    def finalize(self) -> None:
        """FSDP: the trained model gathered whole into a plain copy (every rank; a collective),
        which :meth:`weights` and :meth:`model_files` give."""
        if self.strategy == "fsdp":
            model_state, _ = torch_strategies.full_state("fsdp", self.model, self.optimizer)
            self._final = torch_strategies.plain_copy(thaw(self.template)["model"], model_state)

    def _plain_model(self) -> Any:
        if self.strategy != "fsdp":
            return self.model
        if self._final is None:
            raise RuntimeError("an FSDP fit's model is gathered at the end of training (finalize, on every rank); "
                               "it is not available before")
        return self._final

    def weights(self) -> bytes:
        return state_bytes(self._plain_model())

    def model_files(self) -> dict[str, bytes]:
        return serialize_model(self._plain_model())

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        remove = getattr(self.optimizer, "remove_hooks", None)
        if callable(remove):
            remove()


def _perplexity(loss: float) -> float:
    """``exp(loss)``; inf past float range (a diverged run), not an OverflowError."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def _quiet_compute(metric: Any) -> Any:
    """``metric.compute()`` on a rank that saw no rows (its part of the cross-rank sync), without
    torchmetrics' warning that compute came before any update."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return metric.compute()


__all__ = ["TorchSession", "class_weight_list", "classes_of", "serialize_model"]
