"""Lightning's collective calls (``reduce``, ``all_gather``, ``broadcast``, ``barrier``) over hora.

Lightning calls them with its own vocabulary: reduce ops as strings (``"mean"``, ``"sum"``,
``"max"``... the name of a ``self.log(..., reduce_fx=)`` function) or as
``torch.distributed.ReduceOp`` members, and process groups as ``group=``. This module
turns that vocabulary into hora's and keeps the semantics of Lightning's DDP strategy:
``reduce`` leaves non-tensors unchanged and averages integer tensors by a sum and a
division back into the integer dtype, ``all_gather`` stacks (``(world_size, *shape)``).
"""

from __future__ import annotations

from typing import Any

import torch

import hora.native as hn
from hora.errors import ConfigError

_OP_NAMES = {
    "mean": "Average", "avg": "Average", "average": "Average",
    "sum": "Sum", "max": "Max", "min": "Min", "product": "Product", "prod": "Product",
}


def process_set_of(group: Any, what: str) -> Any:
    """hora's process set for Lightning's ``group=`` argument (None: every rank).

    Raises:
        ConfigError: ``group`` is something other than None or a hora ProcessSet (a
            ``torch.distributed`` group means nothing to hora).
    """
    if group is None:
        return hn.global_process_set
    if isinstance(group, hn.ProcessSet):
        return group
    wld = getattr(getattr(torch.distributed, "group", None), "WORLD", object())
    if group is wld:
        return hn.global_process_set
    raise ConfigError(
        f"{what}: group={group!r} is not a hora process set; hora's Lightning strategy reduces over every rank "
        "(group=None) or over a hora.native.ProcessSet"
    )


def reduce_op_name(reduce_op: Any) -> str:
    """hora's op name (``"Average"``, ``"Sum"``, ``"Max"``, ``"Min"``, ``"Product"``) for Lightning's
    ``reduce_op``: None (mean), a string, a ``torch.distributed.ReduceOp`` member or a hora ReduceOp.

    Raises:
        ConfigError: an op hora does not have (e.g. BAND, PREMUL_SUM).
    """
    if reduce_op is None:
        return "Average"
    if isinstance(reduce_op, hn.ReduceOp):
        return reduce_op.name
    if isinstance(reduce_op, str):
        key = reduce_op.lower()
    else:  # torch.distributed.ReduceOp.SUM and friends (comparing them to None raises, so read the name)
        key = str(getattr(reduce_op, "name", "") or str(reduce_op).rsplit(".", 1)[-1]).lower()
    if key not in _OP_NAMES:
        raise ConfigError(
            f"reduce_op={reduce_op!r} is not supported by hora; use mean, sum, max, min or product"
        )
    return _OP_NAMES[key]


def reduce(tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
    """Lightning's ``Strategy.reduce``: the tensor reduced over the ranks; non-tensors as they are.

    Raises:
        ConfigError: an unknown op or group.
        CollectiveError: ranks disagree about the tensor (shape, dtype) or a rank is gone.
    """
    if not isinstance(tensor, torch.Tensor):
        return tensor
    ps = process_set_of(group, "reduce")
    op = reduce_op_name(reduce_op)
    if ps.size() == 1:
        return tensor
    t = tensor.detach().contiguous()
    if op == "Average" and not (t.is_floating_point() or t.is_complex()):
        summed = hn.allreduce(t, op=hn.Sum, process_set=ps)
        return summed.copy_(summed / ps.size())  # as Lightning's DDP: an integer mean stays an integer
    return hn.allreduce(t, op=getattr(hn, op), process_set=ps)


class _AllGather(torch.autograd.Function):
    """Stacked allgather whose backward sends each rank the sum of the gradients for its slice."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, ps: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.ps = ps
        return hn.allgather(tensor.detach().unsqueeze(0).contiguous(), process_set=ps)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        summed = hn.allreduce(grad.contiguous(), op=hn.Sum, process_set=ctx.ps)
        return summed[ctx.ps.rank()], None


def all_gather(tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
    """Lightning's ``Strategy.all_gather``: every rank's ``tensor`` stacked, shape ``(world_size, *shape)``.

    With ``sync_grads`` the result is differentiable: each rank's input receives the sum,
    over the ranks, of the gradient flowing into its slice.

    Raises:
        ConfigError: an unknown group.
        CollectiveError: ranks hold tensors of different shapes or dtypes.
    """
    ps = process_set_of(group, "all_gather")
    if not isinstance(tensor, torch.Tensor):
        raise ConfigError(f"all_gather takes a tensor, got {type(tensor).__name__}")
    if sync_grads and tensor.requires_grad:
        return _AllGather.apply(tensor, ps)
    return hn.allgather(tensor.detach().unsqueeze(0).contiguous(), process_set=ps)


def broadcast(obj: Any, src: int = 0) -> Any:
    """Lightning's ``Strategy.broadcast``: rank ``src``'s (picklable) object on every rank."""
    if hn.size() == 1:
        return obj
    return hn.broadcast_object(obj, root_rank=src)


def barrier() -> None:
    """Lightning's ``Strategy.barrier``: returns once every rank has called it."""
    if hn.size() > 1:
        hn.barrier()


__all__ = ["all_gather", "barrier", "broadcast", "process_set_of", "reduce", "reduce_op_name"]
