"""PyTorch hooks for the engine-neutral fit pipeline (see :class:`hora.estimators.trainer.Trainer`).

Conventions for users of ``TorchEstimator``:

* the model is called as ``model(*features)``, one tensor per feature column, each
  reshaped to its ``input_shapes`` entry when given (``[-1, 1, 8, 8]``);
* floating features are cast to the model's parameter dtype, integer features stay int64;
* the model returns one tensor, or a tuple/list with one tensor per label column;
* a label is aligned to its output: integer labels with an output of shape
  ``(n, classes)`` (classes > 1) stay int64 (classification, e.g. ``CrossEntropyLoss``);
  otherwise the label is cast to the output dtype and reshaped to the output's shape
  when both hold the same number of values per row (``(n,)`` vs ``(n, 1)``);
* with ``sample_weight_col``, loss modules with a ``reduction`` attribute are run with
  ``reduction="none"`` and the per-row losses averaged with the weights; plain
  callables must then return one loss per row.
"""

from __future__ import annotations

import copy
import io
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from hora.errors import ConfigError, DataError
from hora.estimators.spec import freeze, thaw
from hora.estimators.trainer import Trainer

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------
# tensor helpers (shared by the worker and inference)
# ---------------------------------------------------------------------------------------
def _param_dtype(model: Any):
    import torch

    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def to_inputs(model: Any, arrays: Sequence[np.ndarray], input_shapes: Any, device: Any = None) -> list:
    """Feature arrays -> model input tensors (reshaped, floats in the model's dtype)."""
    import torch

    dtype = _param_dtype(model)
    out = []
    for i, arr in enumerate(arrays):
        arr = np.asarray(arr)
        if arr.dtype == object:
            arr = np.stack([np.asarray(v) for v in arr])
        t = _tensor(arr)
        if t.is_floating_point():
            t = t.to(dtype)
        elif t.dtype == torch.bool:
            t = t.to(dtype)
        if input_shapes is not None:
            shape = list(input_shapes[i])
            try:
                t = t.reshape(shape)
            except RuntimeError as exc:
                raise DataError(
                    f"feature {i} with batch shape {tuple(arr.shape)} cannot be reshaped to input_shapes[{i}]={shape}: {exc}"
                ) from exc
        if device is not None:
            t = t.to(device, non_blocking=True)
        out.append(t)
    return out


def as_outputs(output: Any, n_labels: int) -> list:
    """The model's return value as a list of tensors, one per label.

    Raises:
        ConfigError: the model returns something else, or the wrong number of outputs.
    """
    import torch

    if isinstance(output, torch.Tensor):
        outs = [output]
    elif isinstance(output, (list, tuple)) and all(isinstance(o, torch.Tensor) for o in output):
        outs = list(output)
    else:
        raise ConfigError(f"the model must return a tensor or a tuple of tensors, got {type(output).__name__}")
    if len(outs) != n_labels:
        raise ConfigError(f"the model returns {len(outs)} outputs but there are {n_labels} label_cols")
    return outs


def align_label(output: Any, label: Any, name: str = "label") -> Any:
    """``label`` (a tensor) in the dtype and shape ``output`` needs (see the module docstring).

    Raises:
        ConfigError: the per-row shapes are incompatible (names the label and both shapes).
    """
    import torch

    if label.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8) and output.is_floating_point():
        if output.dim() == label.dim() + 1 and output.shape[-1] > 1 and tuple(output.shape[:-1]) == tuple(label.shape):
            return label.long()
    label = label.to(output.dtype) if output.is_floating_point() else label
    if tuple(label.shape) != tuple(output.shape):
        n = output.shape[0] if output.dim() else 1
        if output.dim() >= 1 and label.dim() >= 1 and label.shape[0] == n and label.numel() == output.numel():
            return label.reshape(output.shape)
        raise ConfigError(
            f"label {name!r} has per-row shape {tuple(label.shape[1:])} but the model's output for it has "
            f"per-row shape {tuple(output.shape[1:])}"
        )
    return label


def _metric_name(metric: Any, used: set[str]) -> str:
    name = getattr(metric, "__name__", None) or type(metric).__name__
    name = name.lower().strip("<>")
    if name == "lambda":
        name = "metric"
    base, i = name, 1
    while name in used:
        i += 1
        name = f"{base}_{i}"
    used.add(name)
    return name


def normalize_metrics(metrics: Any) -> list[tuple[str, Any]]:
    """``[(name, metric), ...]`` from a list, a dict or a single metric.

    Raises:
        ConfigError: a metric is neither callable nor a torchmetrics Metric.
    """
    if metrics is None:
        return []
    if isinstance(metrics, dict):
        items = [(str(k), v) for k, v in metrics.items()]
    else:
        if callable(metrics) and not isinstance(metrics, (list, tuple)):
            metrics = [metrics]
        used: set[str] = set()
        items = [(_metric_name(m, used), m) for m in metrics]
    for name, m in items:
        if not callable(m) and not hasattr(m, "update"):
            raise ConfigError(f"metric {name!r} must be a callable (output, label) -> tensor or a torchmetrics Metric, got {m!r}")
    return items


def _is_torchmetric(m: Any) -> bool:
    return hasattr(m, "update") and hasattr(m, "compute") and hasattr(m, "reset")


def _per_row_loss_fn(fn: Any) -> Any:
    """A copy of a loss module that returns per-row losses (``reduction="none"``)."""
    if hasattr(fn, "reduction"):
        fn = copy.copy(fn)
        fn.reduction = "none"
    return fn


def _weighted(loss: Any, weights: Any) -> Any:
    if loss.dim() == 0:
        raise ConfigError("sample_weight_col needs a loss returning one value per row; use reduction='none'")
    per_row = loss.reshape(loss.shape[0], -1).mean(dim=1)
    w = weights.to(per_row.dtype).reshape(-1)
    return (per_row * w).sum() / w.sum().clamp_min(1e-12)


# ---------------------------------------------------------------------------------------
# worker state
# ---------------------------------------------------------------------------------------
@dataclass
class TorchState:
    """Per-run state of one torch worker (what :meth:`TorchTrainer.setup` returns)."""

    hvd: Any
    model: Any
    optimizer: Any
    losses: list
    metrics: list
    feature_cols: tuple
    label_cols: tuple
    sample_weight_col: str | None
    input_shapes: Any
    loss_weights: list
    device: Any
    backward_passes_per_step: int
    metric_rows: int = 0
    extra: dict = field(default_factory=dict)


class TorchTrainer(Trainer):
    """The PyTorch implementation of the framework hooks (see :class:`~hora.estimators.trainer.Trainer`)."""

    name = "torch"

    # ---- driver ------------------------------------------------------------------------
    def check(self, config: Any, sample: dict[str, np.ndarray]) -> dict[str, Any]:
        import torch

        model = config.model
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        params = list(model.parameters())
        if not params:
            raise ConfigError("model has no parameters to train")
        opt = config.optimizer
        if isinstance(opt, torch.optim.Optimizer):
            model_ids = {id(p) for p in params}
            opt_params = [p for g in opt.param_groups for p in g["params"]]
            foreign = [p for p in opt_params if id(p) not in model_ids]
            if not opt_params or foreign:
                raise ConfigError(
                    f"optimizer {type(opt).__name__} is not bound to the model's parameters "
                    f"({len(foreign)} of its {len(opt_params)} parameters are not the model's); "
                    "create it with model.parameters(), or pass a factory params -> optimizer"
                )
        elif callable(opt):
            try:
                built = opt(model.parameters())
            except Exception as exc:
                raise ConfigError(f"optimizer factory failed on the model's parameters: {type(exc).__name__}: {exc}") from exc
            if not isinstance(built, torch.optim.Optimizer):
                raise ConfigError(f"optimizer factory must return a torch.optim.Optimizer, got {type(built).__name__}")
        else:
            raise ConfigError(f"optimizer must be a torch.optim.Optimizer or a factory params -> optimizer, got {opt!r}")
        metrics = normalize_metrics(config.metrics)

        n = len(next(iter(sample.values()))) if sample else 0
        if n == 0:
            raise DataError("cannot check the model on an empty DataFrame sample")
        inputs = to_inputs(model, [sample[c] for c in config.feature_cols], config.input_shapes)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                try:
                    raw = model(*inputs)
                except Exception as exc:
                    shapes = [tuple(t.shape) for t in inputs]
                    raise ConfigError(
                        f"the model's forward pass failed on a sample of the data (inputs of shapes {shapes} "
                        f"from feature_cols {list(config.feature_cols)}): {type(exc).__name__}: {exc}"
                    ) from exc
                outs = as_outputs(raw, len(config.label_cols))
                losses = config.loss if isinstance(config.loss, (list, tuple)) else [config.loss] * len(outs)
                for i, (out, name) in enumerate(zip(outs, config.label_cols)):
                    label = _tensor(_stack(sample[name]))
                    label = align_label(out, label, name)
                    fn = losses[i]
                    if config.sample_weight_col is not None:
                        fn = _per_row_loss_fn(fn)
                    try:
                        value = fn(out, label)
                    except Exception as exc:
                        raise ConfigError(
                            f"loss for label {name!r} failed on the model output (shape {tuple(out.shape)}) "
                            f"and the label (shape {tuple(label.shape)}): {type(exc).__name__}: {exc}"
                        ) from exc
                    if config.sample_weight_col is not None:
                        _weighted(value, torch.ones(out.shape[0]))
                    elif value.dim() != 0:
                        raise ConfigError(f"loss for label {name!r} must return a scalar, got shape {tuple(value.shape)}")
                    for mname, m in metrics:
                        if _is_torchmetric(m):
                            continue
                        try:
                            m(out, label)
                        except Exception as exc:
                            raise ConfigError(f"metric {mname!r} failed on label {name!r}: {type(exc).__name__}: {exc}") from exc
        finally:
            model.train(was_training)
        return {"output_shapes": [tuple(int(d) for d in o.shape[1:]) for o in outs]}

    def freeze_payload(self, config: Any) -> bytes:
        # model and optimizer in one pickle: the optimizer stays bound to the model's parameters
        return freeze(
            {
                "model": config.model,
                "optimizer": config.optimizer,
                "loss": config.loss,
                "metrics": config.metrics,
                "compression": config.gradient_compression,
            }
        )

    def load_model(self, payload: bytes, weights: bytes) -> Any:
        import torch

        model = thaw(payload)["model"]
        model.load_state_dict(torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True))
        model.eval()
        return model

    def serialize_model(self, model: Any) -> dict[str, bytes]:
        import torch

        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        return {"model.pkl": freeze(model), "weights.pt": buf.getvalue()}

    def deserialize_model(self, files: dict[str, bytes]) -> Any:
        import torch

        model = thaw(files["model.pkl"])
        model.load_state_dict(torch.load(io.BytesIO(files["weights.pt"]), map_location="cpu", weights_only=True))
        model.eval()
        return model

    def predict(self, model: Any, inputs: Sequence[np.ndarray], input_shapes: Any, batch_size: int) -> list[np.ndarray]:
        import torch

        n = len(inputs[0]) if inputs else 0
        model.eval()
        chunks: list[list[np.ndarray]] = []
        with torch.inference_mode():
            for start in range(0, n, batch_size):
                part = [a[start : start + batch_size] for a in inputs]
                outs = model(*to_inputs(model, part, input_shapes))
                outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
                chunks.append([o.detach().cpu().double().numpy() for o in outs])
        if not chunks:
            return []
        return [np.concatenate([c[i] for c in chunks]) for i in range(len(chunks[0]))]

    # ---- worker ------------------------------------------------------------------------
    def setup(self, spec: Any) -> TorchState:
        import torch

        import hora.torch as hvd

        if not hvd.is_initialized():
            hvd.init()
        torch.manual_seed(spec.seed)
        np.random.seed(spec.seed % (2**32))
        payload = thaw(spec.payload)
        model = payload["model"]
        opt = payload["optimizer"]
        if not isinstance(opt, torch.optim.Optimizer):
            opt = opt(model.parameters())
        device = None
        if spec.use_gpu:
            if not torch.cuda.is_available():
                raise ConfigError(f"use_gpu=True but rank {hvd.rank()} sees no CUDA device")
            device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
            torch.cuda.set_device(device)
            model.to(device)  # moves parameters in place: the optimizer stays bound
        scale = hvd.size() if spec.lr_scaling == "linear" else 1
        for group in opt.param_groups:
            if spec.learning_rate is not None:
                group["lr"] = spec.learning_rate
            if "lr" in group:
                group["lr"] = group["lr"] * scale
                group.setdefault("initial_lr", group["lr"])
        kwargs: dict[str, Any] = {"backward_passes_per_step": spec.backward_passes_per_step}
        if payload["compression"] is not None:
            kwargs["compression"] = payload["compression"]
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **kwargs)
        n_labels = len(spec.label_cols)
        loss = payload["loss"]
        losses = list(loss) if isinstance(loss, (list, tuple)) else [loss] * n_labels
        if spec.sample_weight_col is not None:
            losses = [_per_row_loss_fn(fn) for fn in losses]
        metrics = []  # (key, metric, label index): stateful metrics get one copy per label
        for mname, m in normalize_metrics(payload["metrics"]):
            for i, label in enumerate(spec.label_cols):
                key = mname if n_labels == 1 else f"{label}_{mname}"
                mi = copy.deepcopy(m) if (n_labels > 1 and _is_torchmetric(m)) else m
                if device is not None and _is_torchmetric(mi) and hasattr(mi, "to"):
                    mi = mi.to(device)
                metrics.append((key, mi, i))
        return TorchState(
            hvd=hvd,
            model=model,
            optimizer=opt,
            losses=losses,
            metrics=metrics,
            feature_cols=tuple(spec.feature_cols),
            label_cols=tuple(spec.label_cols),
            sample_weight_col=spec.sample_weight_col,
            input_shapes=spec.input_shapes,
            loss_weights=list(spec.loss_weights) if spec.loss_weights else [1.0] * n_labels,
            device=device,
            backward_passes_per_step=spec.backward_passes_per_step,
        )

    def rank(self, state: TorchState) -> int:
        return state.hvd.rank()

    def size(self, state: TorchState) -> int:
        return state.hvd.size()

    def _forward_loss(self, state: TorchState, batch: dict[str, np.ndarray]) -> tuple[Any, list, list]:
        inputs = to_inputs(state.model, [batch[c] for c in state.feature_cols], state.input_shapes, state.device)
        outs = as_outputs(state.model(*inputs), len(state.label_cols))
        labels = []
        weights = None
        if state.sample_weight_col is not None:
            weights = _tensor(batch[state.sample_weight_col])
            if state.device is not None:
                weights = weights.to(state.device)
        total = None
        for i, (out, name) in enumerate(zip(outs, state.label_cols)):
            label = _tensor(_stack(batch[name]))
            if state.device is not None:
                label = label.to(state.device)
            label = align_label(out, label, name)
            labels.append(label)
            value = state.losses[i](out, label)
            if weights is not None:
                value = _weighted(value, weights)
            value = value * state.loss_weights[i]
            total = value if total is None else total + value
        return total, outs, labels

    def train_step(self, state: TorchState, batch: dict[str, np.ndarray], step: int) -> float:
        k = state.backward_passes_per_step
        if step % k == 0:
            state.optimizer.zero_grad()
        loss, _, _ = self._forward_loss(state, batch)
        (loss / k if k > 1 else loss).backward()
        if (step + 1) % k == 0:
            state.optimizer.step()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise DataError(f"training loss became {value} at step {step} on rank {state.hvd.rank()}")
        return value

    def finish_epoch(self, state: TorchState, steps: int) -> None:
        if steps % state.backward_passes_per_step:
            state.optimizer.step()  # the partial accumulation window (step() reduces what is pending)

    def eval_keys(self, state: TorchState) -> list[str]:
        return ["loss", "_n"] + [key for key, _, _ in state.metrics]

    def eval_batch(self, state: TorchState, batch: dict[str, np.ndarray]) -> dict[str, float]:
        import torch

        with torch.no_grad():
            loss, outs, labels = self._forward_loss(state, batch)
            n = int(outs[0].shape[0])
            result = {"loss": float(loss) * n, "_n": float(n)}
            for key, m, i in state.metrics:
                if _is_torchmetric(m):
                    m.update(outs[i], labels[i])
                else:
                    result[key] = float(torch.as_tensor(m(outs[i], labels[i])).float().mean()) * n
            state.metric_rows += n
        return result

    def eval_finish(self, state: TorchState) -> dict[str, float]:
        out: dict[str, float] = {}
        rows = state.metric_rows
        state.metric_rows = 0
        for key, m, _ in state.metrics:
            if _is_torchmetric(m):
                if rows:
                    out[key] = float(m.compute().float().mean()) * rows
                m.reset()
        return out

    def allreduce_sum(self, state: TorchState, values: np.ndarray) -> np.ndarray:
        import torch

        t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64))
        if state.hvd.size() == 1:
            return t.numpy().copy()
        summed = state.hvd.allreduce(t, op=state.hvd.Sum, name="hora.estimators.metrics")
        return summed.numpy().copy()

    def broadcast_initial(self, state: TorchState) -> None:
        state.hvd.broadcast_parameters(state.model.state_dict(), root_rank=0)
        state.hvd.broadcast_optimizer_state(state.optimizer, root_rank=0)

    def state_bytes(self, state: TorchState, extra: dict[str, Any]) -> bytes:
        import torch

        buf = io.BytesIO()
        torch.save({"model": state.model.state_dict(), "optimizer": state.optimizer.state_dict(), "extra": extra}, buf)
        return buf.getvalue()

    def load_state(self, state: TorchState, data: bytes) -> dict[str, Any]:
        import torch

        ckpt = torch.load(io.BytesIO(data), map_location=state.device or "cpu", weights_only=False)
        if "model" in ckpt:
            state.model.load_state_dict(ckpt["model"])
        if "optimizer" in ckpt:
            state.optimizer.load_state_dict(ckpt["optimizer"])
        return dict(ckpt.get("extra", {}))

    def weights_bytes(self, state: TorchState) -> bytes:
        import torch

        buf = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in state.model.state_dict().items()}, buf)
        return buf.getvalue()

    def set_train(self, state: TorchState, training: bool) -> None:
        state.model.train(training)

    def teardown(self, state: TorchState) -> None:
        remove = getattr(state.optimizer, "remove_hooks", None)
        if callable(remove):
            remove()


def _tensor(arr: np.ndarray) -> Any:
    """A tensor of ``arr`` (shares memory when it can; copies read-only arrays, e.g. from Arrow)."""
    import torch

    arr = np.ascontiguousarray(arr)
    if not arr.flags.writeable:
        arr = arr.copy()
    return torch.from_numpy(arr)


def _stack(arr: np.ndarray) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.dtype == object:
        return np.stack([np.asarray(v) for v in arr])
    return arr


__all__ = ["TorchTrainer", "TorchState", "to_inputs", "as_outputs", "align_label", "normalize_metrics"]
