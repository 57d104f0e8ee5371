"""Checking and naming the arguments of a collective, shared by :mod:`hora.native.collectives`
and :mod:`hora.native.objects`: the tensor (torch or numpy) and its device, the reduce op,
the process set (registered, and this rank a member) and the op's name (``"<op>.noname.<n>"``
counted per process set when none is given). Each raises the :mod:`hora.errors` type a user
can act on, naming the op."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hora.errors import ConfigError, DataError
from hora.native.backends.base import ReduceOp
from hora.native.process_sets import ProcessSet, global_process_set
from hora.native.state import _State

#: the dtypes the reducing collectives accept
NUMERIC_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64,
                  torch.int8, torch.uint8, torch.int16}


def as_torch(x: Any, what: str) -> tuple[torch.Tensor, bool]:
    """``x`` as a torch tensor the engine may read and write (detached from autograd:
    the collectives' own gradients are hora.torch's business), and whether it was numpy."""
    if isinstance(x, torch.Tensor):
        return (x.detach() if x.requires_grad else x), False
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            raise DataError(f"{what}: numpy arrays of dtype object cannot be communicated")
        if not x.flags.writeable:
            x = x.copy()
        try:
            return torch.from_numpy(x), True
        except TypeError as exc:
            raise DataError(f"{what}: numpy dtype {x.dtype} is not supported: {exc}") from None
    raise DataError(f"{what} must be a torch.Tensor or a numpy.ndarray, got {type(x).__name__}")


def resolve_process_set(st: _State, process_set: ProcessSet | None, what: str) -> ProcessSet:
    if process_set is None or process_set is global_process_set:
        return global_process_set
    ps = process_set
    if not isinstance(ps, ProcessSet):
        raise ConfigError(f"{what}: process_set must be a hora ProcessSet, got {type(ps).__name__}")
    if ps.process_set_id is None:
        raise ConfigError(f"{what}: {ps!r} is not registered; call hora.add_process_set() on every rank first")
    ranks = ps.ranks if ps.ranks is not None else list(range(st.size))
    if st.rank not in ranks:
        raise ConfigError(f"{what}: rank {st.rank} is not a member of {ps!r}")
    return ps


def reduce_op(op: Any, what: str) -> ReduceOp:
    if type(op) is ReduceOp:
        return op
    try:
        return ReduceOp(op)
    except (ValueError, TypeError):
        raise ConfigError(f"{what}: op={op!r} is not one of hora.Sum, Average, Min, Max, Product") from None


def check_device(t: torch.Tensor, what: str, st: _State) -> None:
    if not t.is_cpu:
        if t.device.type == "cuda" and not st.engine.supports_device("cuda"):
            raise ConfigError(f"{what}: CUDA tensors need the NCCL backend, which is not available here")
        if t.device.type not in ("cuda",):
            raise DataError(f"{what}: tensors on device {t.device} are not supported")


def op_name(st: _State, kind: str, name: str | None, process_set: ProcessSet | None = None) -> str:
    if name is None:
        return st.auto_name(kind, (process_set.process_set_id or 0) if process_set is not None else 0)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{kind}: name must be a non-empty string, got {name!r}")
    return name


def process_set_or_none(process_set: Any) -> ProcessSet | None:
    """``process_set`` when it is a ProcessSet (else None: the global set, or an argument
    that the op's own checks reject)."""
    return process_set if isinstance(process_set, ProcessSet) else None


def returned(t: torch.Tensor, as_numpy: bool) -> Any:
    return t.numpy() if as_numpy else t


__all__ = ["NUMERIC_DTYPES", "as_torch", "check_device", "op_name", "process_set_or_none", "reduce_op",
           "resolve_process_set", "returned"]
