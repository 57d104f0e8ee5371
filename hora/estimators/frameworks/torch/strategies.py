"""How the ranks of a ``TorchEstimator`` fit share the work (``strategy=``), on the worker.

* ``"hora"``: hora's ``DistributedOptimizer`` allreduces the gradients (Horovod's way);
  every rank holds the whole model, gradients and optimizer state.
* ``"zero1"`` / ``"zero2"``: the same optimizer with ``sharding="optimizer"`` /
  ``"gradients"`` (ZeRO stages 1 and 2, over hora's own collectives).
* ``"ddp"``: torch's ``DistributedDataParallel`` on the ``torch.distributed`` group
  :func:`hora.torch.init_process_group` builds over hora's rendezvous; the optimizer is the
  plain torch one.
* ``"fsdp"``: FSDP2's ``fully_shard`` on that group (parameters, gradients and optimizer
  state sharded: ZeRO stage 3): each direct child of the model that holds parameters (each
  element of a child ``ModuleList`` / ``Sequential``) is one unit, then the model itself.

Checkpoints. ``"fsdp"`` writes torch's distributed checkpoint (DCP): every rank its own
shards of the model and optimizer state, to the run's checkpoint folder in the Store
(``dcp-e<epoch>-s<step>-g<global step>-a<attempt>/``, ``.metadata`` and the files' checksums last,
by rank 0; every file through the Store's retried operations, :mod:`hora.estimators.frameworks.torch.dcp`), and the
checkpoint rank 0 commits (the Store's atomic per-epoch file) holds the folder's name and the
small rest (position, scheduler, scaler): no rank ever holds the whole state, and a folder no
committed checkpoint names (a crash mid-write) is never read. A resume loads it at any number
of ranks (DCP reshards); another strategy loads it whole (:func:`load_dcp_whole`).
``"zero1"`` / ``"zero2"`` write the optimizer's shards the same way (``zero-e...-a<attempt>/``,
each rank its ``shard-<rank>-of-<size>.pt``, a barrier before rank 0 commits), and the committed
checkpoint holds the folder's name and the model's weights (replicated on every rank): no rank
gathers the optimizer state to save it; a resume at any number of ranks reshards it, and another
strategy loads it whole in torch's format. The other strategies' checkpoints hold the whole
model's ``state_dict`` and the whole optimizer state in torch's own format (parameters
numbered in the param groups' order).
"""

from __future__ import annotations

import gc
import logging
from collections import defaultdict
from typing import Any

logger = logging.getLogger(__name__)

#: the strategies, and the ``DistributedOptimizer(sharding=)`` of the ZeRO ones
STRATEGIES = ("hora", "zero1", "zero2", "ddp", "fsdp")
SHARDING_OF = {"zero1": "optimizer", "zero2": "gradients"}
#: the strategies whose checkpoint is a collective (the state is gathered from the shards)
COLLECTIVE_CHECKPOINT = ("zero1", "zero2", "fsdp")
#: the strategies whose checkpoints every rank writes as shards in the run's folder, and how
SHARDED_CHECKPOINT = {"fsdp": "dcp", "zero1": "zero", "zero2": "zero"}
#: the strategies that run on torch.distributed's default group (not hora's DistributedOptimizer)
TORCH_DISTRIBUTED = ("ddp", "fsdp")


def rebind(opt: Any, model: Any, names: dict[int, str]) -> Any:
    """A copy of ``opt`` (its class, hyperparameters and settings, no state) over ``model``'s
    parameters now, matched by name (``names``: id of each old parameter -> its name).

    A copy rather than a new construction: not every optimizer's settings are arguments of
    its ``__init__`` (AdamW's ``decoupled_weight_decay``)."""
    params = dict(model.named_parameters())
    new = object.__new__(type(opt))
    new.__dict__.update({k: v for k, v in opt.__dict__.items() if k != "step"})  # (an LR scheduler's wrapper)
    new.state = defaultdict(dict)
    new.param_groups = []
    for group in opt.param_groups:
        new.add_param_group({**{k: v for k, v in group.items() if k != "params"},
                             "params": [params[names[id(p)]] for p in group["params"]]})
    return new


def shard_units(model: Any) -> list[Any]:
    """The modules ``fully_shard`` wraps before the model itself (see the module docstring)."""
    import torch

    custom = getattr(model, "shard_units", None)  # a Hugging Face model's _no_split_modules (hora.estimators.frameworks.torch.hf)
    if callable(custom):
        return custom()

    units = []
    for child in model.children():
        members = list(child) if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)) else [child]
        units += [m for m in members if any(True for _ in m.parameters())]
    return units


def gloo_comms() -> tuple[Any, Any] | None:
    """``(all-gather, reduce-scatter)`` for FSDP2 on Gloo (CPU), or None where this torch has no
    custom comms.

    Gloo has no native form of either on the CPU and copies: measured on a 117 MiB unit (an
    embedding of a 146.6M-parameter model) at 2 ranks, ``all_gather_into_tensor`` and
    ``reduce_scatter_tensor`` each hold ~177 MiB of temporaries besides their input and
    output. These do the same in ~60 MiB: the all-gather is one in-place broadcast per rank
    into its block of the output; the reduce-scatter an in-place allreduce of FSDP's own
    reduce-scatter input (a buffer FSDP made for it) and a copy of this rank's block (an
    average: the sum, then divided by the size, as Gloo does). Ops other than sum and
    average go to Gloo's reduce-scatter."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
    except ImportError:
        return None
    import torch
    import torch.distributed as dist

    class _Alloc:
        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            return torch.empty(*size, dtype=dtype, device=device)

    class BroadcastAllGather(_Alloc, AllGather):
        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False) -> None:
            n = input_tensor.numel()
            me = dist.get_rank(group)
            output_tensor[me * n:(me + 1) * n].copy_(input_tensor)
            for k in range(dist.get_world_size(group)):
                dist.broadcast(output_tensor[k * n:(k + 1) * n], group_src=k, group=group)
            return None

    class AllreduceReduceScatter(_Alloc, ReduceScatter):
        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any,
                     async_op: bool = False) -> Any:
            average = op == dist.ReduceOp.AVG
            if not (average or op == dist.ReduceOp.SUM):
                return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
            dist.all_reduce(input_tensor, op=dist.ReduceOp.SUM, group=group)
            n, size = output_tensor.numel(), dist.get_world_size(group)
            me = dist.get_rank(group)
            output_tensor.copy_(input_tensor.reshape(-1)[me * n:(me + 1) * n].view_as(output_tensor))
            if average:
                output_tensor.div_(size)
            return None

    return BroadcastAllGather(), AllreduceReduceScatter()


def prepare(strategy: str, hvd: Any, model: Any, opt: Any, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """``(module the forward pass runs, optimizer)`` for ``strategy``; ``model`` is on its device
    and ``opt`` bound to it. ``fsdp`` shards ``model`` in place (its parameters become DTensors)."""
    import torch

    if strategy not in TORCH_DISTRIBUTED:
        sharding = SHARDING_OF.get(strategy)
        extra = {"sharding": sharding} if sharding is not None else {}
        return model, hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **kwargs, **extra)
    hvd.init_process_group()
    if strategy == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model), opt
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    names = {id(p): n for n, p in model.named_parameters()}
    first = next(model.parameters(), None)
    device_type = first.device.type if first is not None else "cpu"
    # the mesh of the model's own device: fully_shard's default is the machine's accelerator, so a
    # CPU fit on a host with a GPU would gather its CPU parameters through NCCL (and fail there)
    mesh = init_device_mesh(device_type, (hvd.size(),))
    units = shard_units(model)
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    comms = gloo_comms() if device_type == "cpu" else None
    if comms is not None:
        for unit in [*units, model]:
            unit.set_custom_all_gather(comms[0])
            unit.set_custom_reduce_scatter(comms[1])
    sharded = rebind(opt, model, names)
    # the unsharded parameters live on while anything holds them: the old optimizer (this rank's
    # own copy) lets them go, and a collection frees them now rather than at some later gc pass
    # (an optimizer's hooks can keep it in a reference cycle): a whole model's worth of memory
    opt.state.clear()
    opt.param_groups.clear()
    gc.collect()
    return model, sharded


def _to_torch_format(osd: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name (torch.distributed.checkpoint's) in torch's
    own format: parameters numbered in the param groups' order."""
    ids: dict[str, int] = {}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [ids.setdefault(n, len(ids))
                                                                          for n in g["params"]]}
              for g in osd["param_groups"]]
    return {"state": {ids[n]: st for n, st in osd["state"].items()}, "param_groups": groups}


def _from_torch_format(sd: dict[str, Any], model: Any, opt: Any) -> dict[str, Any]:
    """torch's format keyed by this optimizer's parameter names (the inverse of :func:`_to_torch_format`)."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    ours = [[name_of[id(p)] for p in g["params"]] for g in opt.param_groups]
    theirs = sd["param_groups"]
    if [len(g) for g in ours] != [len(g["params"]) for g in theirs]:
        from hora.errors import ConfigError

        raise ConfigError(f"the checkpoint's optimizer has param groups of {[len(g['params']) for g in theirs]} "
                          f"parameters, this model's {[len(g) for g in ours]}")
    by_id = {i: n for g, names in zip(theirs, ours) for i, n in zip(g["params"], names)}
    return {"state": {by_id[i]: st for i, st in sd["state"].items()},
            "param_groups": [{**{k: v for k, v in g.items() if k != "params"}, "params": names}
                             for g, names in zip(theirs, ours)]}


def full_state(strategy: str, model: Any, opt: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(model state_dict, optimizer state in torch's format)``, whole, on every rank taking part
    (the sharded strategies: every rank must call it)."""
    if strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
        return msd, _to_torch_format(osd)
    if strategy in SHARDING_OF:
        return model.state_dict(), opt.consolidated_state_dict(None)
    return model.state_dict(), opt.state_dict()


def load_state(strategy: str, model: Any, opt: Any, msd: dict[str, Any] | None, osd: dict[str, Any] | None) -> None:
    """Load what :func:`full_state` gave (either may be None: that part is left as it is)."""
    if strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions, set_model_state_dict, set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        if msd is not None:
            set_model_state_dict(model, msd, options=options)
        if osd is not None:
            set_optimizer_state_dict(model, opt, _from_torch_format(osd, model, opt), options=options)
        return
    if msd is not None:
        model.load_state_dict(msd)
    if osd is not None:
        opt.load_state_dict(osd)


def shard_folder(kind: str, epoch: int, step: int, global_step: int, attempt: int) -> str:
    """The name of one sharded checkpoint's folder (the same on every rank of the attempt):
    ``kind`` ``"dcp"`` (fsdp's distributed checkpoint) or ``"zero"`` (the ZeRO optimizer's shards)."""
    return f"{kind}-e{epoch:06d}-s{step:06d}-g{global_step:09d}-a{attempt}"


def save_zero(opt: Any, store: Any, path: str) -> None:
    """This rank's shard of the ZeRO optimizer's state to ``path`` in ``store`` (atomically),
    then a barrier: when it returns every rank's shard is there (a collective)."""
    import hora.torch as hvd

    opt.save_sharded_state_dict(path, store)
    hvd.barrier()


def load_zero(opt: Any, strategy: str, store: Any, path: str) -> dict[str, Any] | None:
    """The ZeRO shards at ``path``: loaded into ``opt`` (a ZeRO strategy: each rank keeps the
    entries it owns now, at any number of ranks), or returned whole in torch's format for
    another strategy to load.

    Raises:
        StoreError: shards missing or of two sizes (naming the folder).
        ConfigError: the shards are of another model (naming the parameter).
    """
    from hora.torch.sharded_state import read_shards, torch_format

    shards = read_shards(path, store)
    if strategy in SHARDING_OF:
        opt.load_state_dict(shards)
        return None
    return torch_format(shards)


def _fsspec_io(store: Any, path: str, write: bool) -> Any:
    """DCP's storage writer / reader for ``path`` in ``store``: every file operation through the
    Store (retried under its policy), every file checksummed (:mod:`hora.estimators.frameworks.torch.dcp`)."""
    from hora.estimators.frameworks.torch.dcp import StoreReader, StoreWriter

    return StoreWriter(store, path) if write else StoreReader(store, path)


def _dcp_error(exc: BaseException, action: str, url: str) -> Exception:
    """The error of a failed collective ``dcp.save`` / ``dcp.load``: the Store's failure (DCP's
    ``CheckpointException``, which carries every rank's storage error, or an ``OSError``) is a
    :class:`~hora.errors.StoreError`; a failed exchange between the ranks (torch.distributed's
    ``RuntimeError``, e.g. Gloo's "Connection closed by peer" when a rank was killed) is a
    :class:`~hora.errors.CollectiveError`, so the run names the lost rank as its root cause and
    ``max_failures`` relaunches it; anything else is the Store's."""
    from torch.distributed.checkpoint.api import CheckpointException

    from hora.errors import CollectiveError, StoreError
    from hora.estimators.frameworks.torch.dcp import data_error_in

    damaged = data_error_in(exc)
    if damaged is not None:  # a shard whose bytes do not match their checksum: names the file and run
        return damaged
    what = f"{action} the distributed checkpoint {url} failed: {type(exc).__name__}: {exc}"
    if isinstance(exc, RuntimeError) and not isinstance(exc, CheckpointException):
        return CollectiveError(f"{what} (the ranks' exchange failed)")
    return StoreError(what)


def save_dcp(model: Any, opt: Any, store: Any, path: str) -> None:
    """This rank's shards of the FSDP ``model``'s and ``opt``'s state to ``path`` in ``store``
    (a collective: every rank calls it; rank 0 writes ``.metadata`` after all have written).

    Raises:
        StoreError: the write failed (names the path).
        CollectiveError: a peer was lost during the ranks' exchange of the plan (a symptom:
            the lost rank is the run's root cause).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    try:
        dcp.save({"model": msd, "optim": osd}, storage_writer=_fsspec_io(store, path, write=True))
    except (Exception, CheckpointException) as exc:  # (DCP's error is a BaseException)
        raise _dcp_error(exc, "writing", store.url_for(path)) from exc


def dcp_mismatch(model: Any, store: Any, path: str) -> str | None:
    """How the checkpoint at ``path`` does not fit ``model`` (a missing or extra parameter or
    buffer, another shape), from its ``.metadata``; None when it fits."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = _fsspec_io(store, path, write=False).read_metadata().state_dict_metadata
    saved = {k[len("model."):]: v for k, v in meta.items() if k.startswith("model.")}
    ours = {}
    for name, value in model.state_dict().items():
        ours[name] = tuple(getattr(value, "shape", ()))
    missing, extra = sorted(set(ours) - set(saved)), sorted(set(saved) - set(ours))
    if missing or extra:
        return f"missing {missing[:5]}, unexpected {extra[:5]}"
    for name, shape in ours.items():
        entry = saved[name]
        if isinstance(entry, TensorStorageMetadata) and tuple(entry.size) != shape:
            return f"{name!r} has shape {tuple(entry.size)} in the checkpoint, {shape} in the model"
    return None


def load_dcp(model: Any, opt: Any, store: Any, path: str, what: str) -> None:
    """Load the distributed checkpoint at ``path`` into the FSDP ``model`` and ``opt``, each rank
    its shards (at any number of ranks: DCP reshards). A collective.

    Raises:
        ConfigError: the checkpoint belongs to another model (``what`` names it).
        StoreError: it cannot be read.
        CollectiveError: a peer was lost during the ranks' exchange of the plan.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from hora.errors import ConfigError

    mismatch = dcp_mismatch(model, store, path)
    if mismatch is not None:
        raise ConfigError(f"{what} belongs to another model: {mismatch}")
    msd, osd = get_state_dict(model, opt)  # (initializes an optimizer without state, lr 0, so DCP fills it)
    state = {"model": msd, "optim": osd}
    try:
        dcp.load(state, storage_reader=_fsspec_io(store, path, write=False))
    except (Exception, CheckpointException) as exc:  # (DCP's error is a BaseException)
        raise _dcp_error(exc, "reading", store.url_for(path)) from exc
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def load_dcp_whole(store: Any, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The distributed checkpoint at ``path`` whole, in this process alone: ``(model state_dict,
    optimizer state in torch's format)`` (what a strategy other than ``"fsdp"`` resumes from).

    Raises:
        StoreError: it cannot be read.
    """
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    try:  # what torch.distributed.checkpoint.format_utils.dcp_to_torch_save does, from any fsspec URL
        _load_state_dict(state, storage_reader=_fsspec_io(store, path, write=False),
                         planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    except (Exception, CheckpointException) as exc:
        from hora.errors import StoreError
        from hora.estimators.frameworks.torch.dcp import data_error_in

        raise data_error_in(exc) or StoreError(f"reading the distributed checkpoint {store.url_for(path)} failed: "
                                               f"{type(exc).__name__}: {exc}") from exc
    return state["model"], _to_torch_format(state["optim"])


def plain_copy(template: Any, state: dict[str, Any]) -> Any:
    """``template`` (a plain, unsharded module: a fresh copy of the model the fit was given)
    with ``state`` loaded, on the CPU."""
    template.load_state_dict({k: v.detach().cpu() for k, v in state.items()})
    return template.cpu()


def evaluating(strategy: str, model: Any, on: bool) -> None:
    """FSDP evaluation: every unit gathered whole before the validation pass (every rank, once)
    and kept so through it, so ranks with different numbers of validation batches need no
    collective per forward; resharded after it."""
    if strategy != "fsdp":
        return
    from torch.distributed.fsdp import FSDPModule

    model.set_reshard_after_forward(not on)  # (recursively: every unit)
    for unit in [m for m in model.modules() if isinstance(m, FSDPModule)]:
        if on:
            unit.unshard()
        else:
            unit.reshard()


__all__ = ["STRATEGIES", "SHARDING_OF", "COLLECTIVE_CHECKPOINT", "TORCH_DISTRIBUTED", "prepare", "full_state",
           "load_state", "shard_folder", "SHARDED_CHECKPOINT", "save_zero", "load_zero", "save_dcp", "load_dcp", "load_dcp_whole", "dcp_mismatch", "plain_copy", "evaluating", "rebind", "shard_units", "gloo_comms"]
