"""Tensor helpers of the Torch estimator (the worker's session and inference share them)."""

from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np

from hora.errors import ConfigError, DataError


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

    if output.is_floating_point() and output.dim() == label.dim() + 1 and output.shape[-1] > 1 and \
            tuple(output.shape[:-1]) == tuple(label.shape):
        if label.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
            return label.long()
        if label.is_floating_point() and bool(torch.all(label == torch.round(label))):
            return label.long()  # class ids stored as doubles (Spark's labels): ids, as Horovod's users pass them
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


def is_torchmetric(m: Any) -> bool:
    return hasattr(m, "update") and hasattr(m, "compute") and hasattr(m, "reset")


def per_row_loss_fn(fn: Any) -> Any:
    """A copy of a loss module that returns per-row losses (``reduction="none"``)."""
    if hasattr(fn, "reduction"):
        fn = copy.copy(fn)
        fn.reduction = "none"
    return fn


def weighted(loss: Any, weights: Any) -> Any:
    if loss.dim() == 0:
        raise ConfigError("sample_weight_col needs a loss returning one value per row; use reduction='none'")
    per_row = loss.reshape(loss.shape[0], -1).mean(dim=1)
    w = weights.to(per_row.dtype).reshape(-1)
    return (per_row * w).sum() / w.sum().clamp_min(1e-12)


def state_bytes(module: Any) -> bytes:
    """``module``'s weights (its ``state_dict`` on the CPU) as ``torch.save`` bytes."""
    import io

    import torch

    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in module.state_dict().items()}, buf)
    return buf.getvalue()


def first_state_mismatch(model_state: dict[str, Any], saved: dict[str, Any]) -> str | None:
    """How the first parameter or buffer of ``saved`` (a checkpoint's ``state_dict``) differs
    from ``model_state`` (the model's), or None when names and shapes all agree."""
    for name, value in model_state.items():
        if name not in saved:
            return f"the model's {name!r} {tuple(value.shape)} is not in the checkpoint"
        theirs = tuple(getattr(saved[name], "shape", ()))
        if theirs != tuple(value.shape):
            return f"{name!r} has shape {theirs} in the checkpoint and {tuple(value.shape)} in the model"
    extra = [name for name in saved if name not in model_state]
    if extra:
        return f"the checkpoint's {extra[0]!r} is not in the model"
    return None


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


__all__ = ["to_inputs", "as_outputs", "align_label", "normalize_metrics", "is_torchmetric", "per_row_loss_fn",
           "weighted", "state_bytes", "first_state_mismatch"]
