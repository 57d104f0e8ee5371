"""Tensor helpers of the Torch estimator (the worker's session and inference share them)."""

from __future__ import annotations

import copy
import functools
from typing import Any, NamedTuple, Sequence

import numpy as np

from hora.errors import ConfigError, DataError
from hora.store.columns import CsrBatch


def _param_dtype(model: Any):
    import torch

    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


class ParamDtype:
    """``_param_dtype(model)`` for a model trained step after step, without a walk of its modules per call.

    The first call finds the first floating-point parameter as :func:`_param_dtype` does and
    keeps it with the chain of modules that holds it; later calls check that chain (each
    module and the parameter still under the same name in its parent) and return the
    parameter's dtype as it is then: ``model.double()`` converts parameters in place, and
    a replaced module or parameter (``model[0] = ...``; torch's
    ``overwrite_module_params_on_conversion``) fails the check, which searches again.
    Not seen: a floating-point parameter registered ahead of the kept one after the first
    call (its optimizer, made before, would not train it either).
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        #: ``(parent, child name, child module)`` from the model down to the module that holds the parameter
        self._modules: list[tuple[Any, str, Any]] = []
        #: ``(that module, name, parameter)``, or None before the first call (or when not found)
        self._param: tuple[Any, str, Any] | None = None

    def __call__(self) -> Any:
        if self._param is not None:
            owner, name, param = self._param
            if owner._parameters.get(name) is param and param.is_floating_point() and \
                    all(parent._modules.get(key) is child for parent, key, child in self._modules):
                return param.dtype
        return self._find()

    def _find(self) -> Any:
        import torch

        self._param = None
        for param in self.model.parameters():
            if param.is_floating_point():
                self._keep(param)
                return param.dtype
        return torch.float32

    def _keep(self, param: Any) -> None:
        """Keep ``param`` with its chain of modules, when ``named_parameters`` names it by its
        place in the modules' ``_modules`` / ``_parameters`` (else nothing is kept)."""
        name = next((n for n, p in self.model.named_parameters() if p is param), None)
        if name is None:
            return
        *path, last = name.split(".")
        chain, module = [], self.model
        for key in path:
            child = getattr(module, "_modules", {}).get(key)
            if child is None:
                return
            chain.append((module, key, child))
            module = child
        if getattr(module, "_parameters", {}).get(last) is param:
            self._modules, self._param = chain, (module, last, param)


def to_inputs(model: Any, arrays: Sequence[np.ndarray], input_shapes: Any, device: Any = None,
              dtype: Any = None) -> list:
    """Feature arrays -> model input tensors (reshaped, floats in the model's dtype: ``dtype``,
    when the caller knows it, else :func:`_param_dtype`)."""
    import torch

    if dtype is None:
        dtype = _param_dtype(model)
    out = []
    for i, arr in enumerate(arrays):
        if isinstance(arr, CsrBatch) and arr.densify:
            arr = arr.toarray()  # (a transform's small vectors, densified per forward chunk)
        if isinstance(arr, CsrBatch) or isinstance(arr, torch.Tensor):
            out.append(_sparse_or_tensor(arr, dtype, device))
            continue
        arr = np.asarray(arr)
        if arr.dtype == object:
            arr = np.stack([np.asarray(v) for v in arr])
        t = _tensor(arr)
        if t.dtype != dtype and (t.is_floating_point() or t.dtype == torch.bool):  # (.to of the same dtype: a no-op)
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


def _sparse_or_tensor(arr: Any, dtype: Any, device: Any) -> Any:
    """A :class:`~hora.store.CsrBatch` as a ``torch.sparse_csr_tensor`` (values in the model's float
    dtype), or a tensor a ``collate_fn`` made, moved to ``device``; never reshaped."""
    import torch

    if isinstance(arr, CsrBatch):
        values = torch.from_numpy(_contiguous(arr.values))
        if values.is_floating_point() and values.dtype != dtype:
            values = values.to(dtype)
        t = torch.sparse_csr_tensor(torch.from_numpy(_contiguous(arr.indptr)),
                                    torch.from_numpy(_contiguous(arr.indices)), values, size=tuple(arr.shape))
    else:
        t = arr
    return t.to(device) if device is not None else t


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


class LabelRule(NamedTuple):
    """What :func:`align_label` does to a label, decided from its and the output's shapes and dtypes.

    ``kind``: ``"ids"`` (``label.long()``), ``"whole_ids"`` (``long()`` when every value is a
    whole number, else ``fallback``), ``"cast"`` (``to(dtype)`` unless None or the label's
    dtype already, then ``reshape(shape)`` unless None) or ``"error"`` (a ConfigError with
    ``message``).
    """

    kind: str
    dtype: Any = None
    shape: Any = None
    message: str = ""
    fallback: "LabelRule | None" = None


def label_rule(output: Any, label: Any, name: str = "label") -> LabelRule:
    """The :class:`LabelRule` that aligns ``label`` (a tensor) to ``output`` (see :func:`align_label`)."""
    import torch

    if output.is_floating_point() and output.dim() == label.dim() + 1 and output.shape[-1] > 1 and \
            tuple(output.shape[:-1]) == tuple(label.shape):
        if label.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
            return LabelRule("ids")
        if label.is_floating_point():  # class ids stored as doubles (Spark's labels): ids, as Horovod's users pass them
            return LabelRule("whole_ids", fallback=_cast_rule(output, label, name))
    return _cast_rule(output, label, name)


def _cast_rule(output: Any, label: Any, name: str) -> LabelRule:
    dtype = output.dtype if output.is_floating_point() else None
    if tuple(label.shape) == tuple(output.shape):
        return LabelRule("cast", dtype)
    n = output.shape[0] if output.dim() else 1
    if output.dim() >= 1 and label.dim() >= 1 and label.shape[0] == n and label.numel() == output.numel():
        return LabelRule("cast", dtype, output.shape)
    return LabelRule("error", message=(
        f"label {name!r} has per-row shape {tuple(label.shape[1:])} but the model's output for it has "
        f"per-row shape {tuple(output.shape[1:])}"))


def apply_label_rule(rule: LabelRule, label: Any) -> Any:
    """``label`` aligned by ``rule`` (from :func:`label_rule` on a label of the same shape and dtype).

    Raises:
        ConfigError: the rule is an error (names the label and both per-row shapes).
    """
    import torch

    if rule.kind == "ids":
        return label.long()
    if rule.kind == "whole_ids":
        if bool(torch.all(label == torch.round(label))):
            return label.long()
        rule = rule.fallback
    if rule.kind == "error":
        raise ConfigError(rule.message)
    if rule.dtype is not None and label.dtype != rule.dtype:  # (.to of the same dtype: a no-op)
        label = label.to(rule.dtype)
    if rule.shape is not None:
        label = label.reshape(rule.shape)
    return label


def align_label(output: Any, label: Any, name: str = "label") -> Any:
    """``label`` (a tensor) in the dtype and shape ``output`` needs (see the module docstring
    of :mod:`hora.estimators.frameworks.torch.codec`): class ids (integers, or floats holding whole numbers) as
    int64 for an output of shape ``(n, classes)``, else cast to the output's floating dtype
    and reshaped to its shape when both hold the same number of values per row.

    Raises:
        ConfigError: the per-row shapes are incompatible (names the label and both shapes).
    """
    return apply_label_rule(label_rule(output, label, name), label)


class LabelConverter:
    """One label column's numpy batches -> tensors aligned to the model's output, for a
    session that trains batch after batch (the same shapes and dtypes, step after step).

    :meth:`tensor` (before the forward pass) converts the batch's array as
    ``_tensor(_stack(...))`` does (and moves it to ``device``); when a batch of the same
    shape and dtype was aligned before by a rule that depends on shapes and dtypes alone,
    it applies that rule already, reshaping on the numpy side. :meth:`align` (after the
    forward pass) keeps that tensor when the output has the shape and dtype the rule was
    made for, else aligns the plain tensor with :func:`align_label`'s rule and keeps the
    rule for the next batch. Values, dtypes, shapes and errors are :func:`align_label`'s.
    """

    #: rules kept per label (batch shapes x dtypes); more are forgotten all at once
    MAX_RULES = 16

    def __init__(self, name: str, device: Any = None) -> None:
        self.name, self.device = name, device
        #: (array shape, array dtype) -> (output shape, output dtype, rule)
        self._rules: dict[tuple, tuple[Any, Any, LabelRule]] = {}

    def tensor(self, values: Any, host: bool = False) -> tuple[Any, np.ndarray, tuple | None]:
        """``(tensor, array, kept rule or None)`` of a batch's label values, for :meth:`align`
        (``host``: the tensor on the CPU, for a feed that copies it to the device itself)."""
        import torch

        moved = (lambda t: t) if host else self._moved
        arr = _contiguous(_stack(values))
        kept = self._rules.get((arr.shape, arr.dtype))
        if kept is None:
            return moved(torch.from_numpy(arr)), arr, None
        rule = kept[2]
        t = moved(torch.from_numpy(arr if rule.shape is None else arr.reshape(rule.shape)))
        if rule.kind == "ids":
            return t.long(), arr, kept
        return (t if rule.dtype is None or t.dtype == rule.dtype else t.to(rule.dtype)), arr, kept

    def align(self, output: Any, converted: tuple[Any, np.ndarray, tuple | None]) -> Any:
        """The label of ``converted`` (from :meth:`tensor`) aligned to ``output``.

        Raises:
            ConfigError: as :func:`align_label`.
        """
        import torch

        t, arr, kept = converted
        if kept is not None:
            if output.shape == kept[0] and output.dtype == kept[1]:
                return t
            t = self._moved(torch.from_numpy(arr))
        rule = label_rule(output, t, self.name)
        label = apply_label_rule(rule, t)
        if rule.kind in ("ids", "cast"):
            if len(self._rules) >= self.MAX_RULES:
                self._rules.clear()
            self._rules[(arr.shape, arr.dtype)] = (output.shape, output.dtype, rule)
        return label

    def _moved(self, t: Any) -> Any:
        return t if self.device is None else t.to(self.device)


def loss_value(loss: Any) -> float:
    """``float(loss.detach())`` (``float(loss)`` for a non-tensor), without making the detached
    tensor when ``loss.item()`` gives the same float: a one-element floating-point ``torch.Tensor``."""
    import torch

    if type(loss) is torch.Tensor and loss.is_floating_point() and loss.numel() == 1:
        return loss.item()
    return float(loss.detach()) if hasattr(loss, "detach") else float(loss)


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
    """A copy of a loss module that returns per-row losses (``reduction="none"``); a loss function
    taking a ``reduction`` keyword (``torch.nn.functional``'s) is called with ``reduction="none"``,
    as Horovod calls it."""
    if hasattr(fn, "reduction"):
        fn = copy.copy(fn)
        fn.reduction = "none"
    elif _takes_reduction(fn):
        fn = functools.partial(fn, reduction="none")
    return fn


def _takes_reduction(fn: Any) -> bool:
    import inspect

    try:
        return "reduction" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


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

    return torch.from_numpy(_contiguous(arr))


def _contiguous(arr: np.ndarray) -> np.ndarray:
    """``arr`` as :func:`_tensor` hands it to ``torch.from_numpy``: C-contiguous and writable."""
    arr = np.ascontiguousarray(arr)
    if not arr.flags.writeable:
        arr = arr.copy()
    return arr


def _stack(arr: np.ndarray) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.dtype == object:
        return np.stack([np.asarray(v) for v in arr])
    return arr


__all__ = ["to_inputs", "ParamDtype", "as_outputs", "align_label", "LabelRule", "label_rule", "apply_label_rule",
           "LabelConverter", "loss_value", "normalize_metrics", "is_torchmetric", "per_row_loss_fn",
           "weighted", "state_bytes", "first_state_mismatch"]
