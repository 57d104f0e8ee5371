"""Make every rank start from the same model and optimizer: broadcast of parameters,
optimizer state and arbitrary picklable objects (Horovod's ``hvd.broadcast_*``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import torch

import hora.native as _hn
from hora.errors import ConfigError

log = logging.getLogger(__name__)


def _named_tensors(params: Any, what: str) -> list[tuple[str, torch.Tensor]]:
    """Turn a state_dict / named_parameters / list of tensors into ``[(name, tensor)]``.

    Raises:
        ConfigError: ``params`` is none of these, or holds a non-tensor or a name twice.
    """
    if isinstance(params, Mapping):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    elif isinstance(params, Iterable) and not isinstance(params, (str, bytes, torch.Tensor)):
        items = []
        for i, item in enumerate(params):
            if isinstance(item, tuple) and len(item) == 2:
                items.append(item)
            elif isinstance(item, torch.Tensor):
                items.append((f"tensor.{i}", item))
            else:
                raise ConfigError(
                    f"{what}: item {i} is {type(item).__name__}; expected (name, tensor) pairs "
                    "(model.named_parameters()), tensors, or a state_dict"
                )
    else:
        raise ConfigError(
            f"{what} takes a state_dict, model.named_parameters() or a list of tensors, got "
            f"{type(params).__name__}"
        )
    out: list[tuple[str, torch.Tensor]] = []
    seen: set[str] = set()
    for name, t in items:
        name = str(name)
        if not isinstance(t, torch.Tensor):
            raise ConfigError(f"{what}: entry {name!r} is {type(t).__name__}, not a torch.Tensor")
        if name in seen:
            raise ConfigError(f"{what}: the name {name!r} occurs twice")
        seen.add(name)
        out.append((name, t))
    return out


def broadcast_parameters(params: Any, root_rank: int = 0, process_set: Any = None) -> None:
    """Overwrite, in place, every tensor in ``params`` with its value on ``root_rank``.

    Args:
        params: ``model.state_dict()`` (parameters and buffers), or
            ``model.named_parameters()``, or a list of ``(name, tensor)`` / tensors.
            All ranks must pass the same names, shapes and dtypes.
        root_rank: the rank whose values everyone receives.
        process_set: ranks taking part (default: all).

    Raises:
        ConfigError: ``params`` has an unsupported form.
        CollectiveError: ranks disagree on a tensor, or the broadcast failed.
    """
    items = _named_tensors(params, "broadcast_parameters")
    ps = _hn.global_process_set if process_set is None else process_set
    handles = []
    for name, t in items:
        # detach: same storage, and no autograd complaint about in-place ops on leaves
        buf = t.detach()
        handles.append(_hn.broadcast_async_(buf, root_rank, name=f"broadcast_parameters.{name}", process_set=ps))
    for h in handles:
        h.synchronize()


def _split_state(state: Mapping[Any, Mapping[str, Any]]) -> tuple[dict, list[tuple[str, torch.Tensor]]]:
    """Separate a state_dict's ``state`` into a picklable skeleton and its tensors."""
    skeleton: dict[Any, dict[str, Any]] = {}
    tensors: list[tuple[str, torch.Tensor]] = []
    for pid in sorted(state, key=str):
        entry: dict[str, Any] = {}
        for key in sorted(state[pid], key=str):
            value = state[pid][key]
            if isinstance(value, torch.Tensor):
                entry[key] = ("tensor", tuple(value.shape), value.dtype)
                tensors.append((f"{pid}.{key}", value))
            else:
                entry[key] = ("value", value)
        skeleton[pid] = entry
    return skeleton, tensors


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0, model: Any = None,
                              process_set: Any = None) -> None:
    """Give every rank the optimizer state and hyperparameters of ``root_rank``.

    Everything in ``optimizer.state_dict()`` travels: per-parameter state tensors
    (momentum buffers, Adam moments) and scalars (``step``), and every
    ``param_groups`` hyperparameter (``lr``, ``betas``, ``weight_decay``...). Ranks
    whose state was not created yet (optimizers create it lazily at the first step)
    receive the root's; when the root has no state, every rank ends with none.

    Unlike Horovod this never runs a zero-gradient ``step()`` to create the state:
    such a step changes parameters under weight decay and advances step counters,
    so a model would no longer match single-process training. As Horovod, a rank whose
    optimizer has no state yet gives every parameter that requires a gradient and has
    none a zero gradient (code written for Horovod may read it): a sparse one for a
    ``SparseAdam`` and for the sparse embeddings of ``model`` (Horovod's third argument,
    used for nothing else).

    Raises:
        ConfigError: ``optimizer`` is not an optimizer, or its parameter groups do not
            match the root's (number of groups or parameters per group).
        CollectiveError: the broadcast failed.

    A sharded DistributedOptimizer (``sharding=``) gets the root's hyperparameters only:
    its state is each rank's own shard (load checkpoints on every rank with
    ``load_sharded_state_dict``).
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(f"broadcast_optimizer_state expects a torch optimizer, got {type(optimizer).__name__}")
    if getattr(optimizer, "_hora_sharding", None):  # a sharded DistributedOptimizer: each rank its own shard
        optimizer._hora_broadcast_hyperparameters(root_rank)
        return
    ps = _hn.global_process_set if process_set is None else process_set
    me = _hn.rank()
    sd = optimizer.state_dict()
    if not sd["state"]:
        sparse = {id(p) for m in (model.modules() if isinstance(model, torch.nn.Module) else ())
                  if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
                    if isinstance(optimizer, torch.optim.SparseAdam) or id(p) in sparse:
                        p.grad = p.grad.to_sparse(1)  # rows, as an embedding's gradient
    skeleton, local_tensors = _split_state(sd["state"])
    layout = [len(g["params"]) for g in sd["param_groups"]]
    meta = (layout, sd["param_groups"], skeleton) if me == root_rank else None
    root_layout, root_groups, root_skeleton = _hn.broadcast_object(
        meta, root_rank=root_rank, name="broadcast_optimizer_state.meta", process_set=ps
    )
    if root_layout != layout:
        raise ConfigError(
            f"broadcast_optimizer_state: rank {me} has parameter groups of sizes {layout} but root "
            f"rank {root_rank} has {root_layout}; build the same optimizer on every rank"
        )
    if me == root_rank:
        tensors = local_tensors
    else:
        # receive buffers laid out like the root's state, on the device of each parameter
        params = [p for g in optimizer.param_groups for p in g["params"]]
        pid_to_param = {}
        for g_local, g_root in zip(optimizer.param_groups, root_groups, strict=True):
            for p, pid in zip(g_local["params"], g_root["params"], strict=True):
                pid_to_param[pid] = p
        tensors = []
        new_state: dict[Any, dict[str, Any]] = {}
        for pid in sorted(root_skeleton, key=str):
            entry: dict[str, Any] = {}
            device = pid_to_param[pid].device if pid in pid_to_param else (params[0].device if params else "cpu")
            for key, spec in root_skeleton[pid].items():
                if spec[0] == "tensor":
                    _, shape, dtype = spec
                    # 'step' and other scalars stay on the cpu, as torch keeps them
                    dev = "cpu" if len(shape) == 0 else device
                    buf = torch.empty(shape, dtype=dtype, device=dev)
                    entry[key] = buf
                    tensors.append((f"{pid}.{key}", buf))
                else:
                    entry[key] = spec[1]
            new_state[pid] = entry
    handles = [
        _hn.broadcast_async_(t.detach(), root_rank, name=f"broadcast_optimizer_state.{name}", process_set=ps)
        for name, t in tensors
    ]
    for h in handles:
        h.synchronize()
    if me != root_rank:
        try:
            optimizer.load_state_dict({"state": new_state, "param_groups": root_groups})
        except (ValueError, KeyError) as exc:
            raise ConfigError(
                f"broadcast_optimizer_state: rank {me} cannot load the state of root rank {root_rank}: {exc}"
            ) from exc


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = None) -> Any:
    """Return ``root_rank``'s ``obj`` (any picklable object) on every rank.

    Raises:
        CollectiveError: the broadcast failed.
    """
    ps = _hn.global_process_set if process_set is None else process_set
    return _hn.broadcast_object(obj, root_rank=root_rank, name=name, process_set=ps)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Return the list of every rank's ``obj``, in rank order.

    Raises:
        CollectiveError: the gather failed.
    """
    ps = _hn.global_process_set if process_set is None else process_set
    return _hn.allgather_object(obj, name=name, process_set=ps)
