"""Checkpoints of the sharded DistributedOptimizer (:mod:`hora.torch.sharded_optimizer`).

A *shard* is one rank's ``state_dict()``::

    {"state": {parameter name: {"exp_avg": tensor, ...}},        # the parameters it owns
     "param_groups": [{"lr": ..., ..., "params": [names]}],      # every group, every name
     "hora_sharded": {"format": 1, "rank": r, "size": n, "sharding": "optimizer"}}

State is keyed by parameter *name*, so shards saved at one number of ranks load at any
other: each rank takes the entries of the parameters it owns now (resharding). A
*consolidated* state dict is torch's own format (integer ids in param-group order),
loadable into the plain optimizer, an unsharded DistributedOptimizer, or a sharded one.
On disk a shard is ``<folder>/shard-<rank>-of-<size>.pt``, written atomically (a
temporary sibling renamed over it; in a :class:`hora.store.Store` through its atomic
``write_bytes``).
"""

from __future__ import annotations

import io
import os
import re
import tempfile
from typing import Any

import torch

from hora.errors import ConfigError, StoreError
from hora.torch.functions import allgather_object

FORMAT = 1
_SHARD_FILE = re.compile(r"^shard-(\d+)-of-(\d+)\.pt$")


def _hyper(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


def _inner_params(opt: Any) -> list[torch.Tensor]:
    return [p for g in opt._hora_inner.param_groups for p in g["params"]]


def shard_state_dict(opt: Any) -> dict[str, Any]:
    """This rank's shard (see the module docstring)."""
    names = opt._hora_names
    inner = opt._hora_inner.state_dict()
    params = _inner_params(opt)
    state = {names[params[i]]: st for i, st in inner["state"].items()}
    groups = [{**_hyper(g), "params": [names[p] for p in g["params"]]} for g in opt.param_groups]
    return {"state": state, "param_groups": groups,
            "hora_sharded": {"format": FORMAT, "rank": opt._hora_me, "size": len(opt._hora_ranks),
                             "sharding": opt._hora_sharding}}


def consolidated_state_dict(opt: Any, to_rank: int | None) -> dict[str, Any] | None:
    """Gather every shard; on ``to_rank`` (every rank for None) return torch's format, elsewhere ``None``."""
    if to_rank is not None and to_rank not in opt._hora_ranks:
        raise ConfigError(f"consolidated_state_dict: to_rank={to_rank!r} is not a rank of the optimizer's "
                          f"process set {opt._hora_ranks}")
    mine = shard_state_dict(opt)
    shards = [mine] if len(opt._hora_ranks) == 1 else allgather_object(
        mine, name="zero.consolidate", process_set=opt._hora_process_set)
    import hora.native as _hn

    if to_rank is not None and _hn.rank() != to_rank:
        return None
    return torch_format(shards)


def torch_format(shards: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's shards (as :func:`read_shards` gives them) in torch's own format: the
    state of every parameter, numbered in the param groups' order, loadable into the plain
    optimizer or an unsharded DistributedOptimizer of the same model."""
    merged: dict[str, Any] = {}
    for s in shards:
        merged.update(s["state"])
    ids: dict[str, int] = {}
    groups = []
    for g in shards[0]["param_groups"]:
        groups.append({**_hyper(g), "params": [ids.setdefault(n, len(ids)) for n in g["params"]]})
    return {"state": {ids[n]: st for n, st in merged.items()}, "param_groups": groups}


def _merge(state_dict: Any, opt: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(state by name, param groups with names)`` from a shard, a list of shards or a
    consolidated state dict, checked against ``opt``'s parameters."""
    ours = [[opt._hora_names[p] for p in g["params"]] for g in opt.param_groups]
    if isinstance(state_dict, (list, tuple)):
        shards = list(state_dict)
        if not shards or not all(isinstance(s, dict) and "hora_sharded" in s for s in shards):
            raise ConfigError("load_state_dict: a list must hold every rank's sharded state_dict()")
        sizes = {s["hora_sharded"]["size"] for s in shards}
        got = sorted(s["hora_sharded"]["rank"] for s in shards)
        if len(sizes) != 1 or got != list(range(sizes.pop())):
            raise ConfigError(f"load_state_dict: the shards must be ranks 0..n-1 of one save, got ranks {got} of "
                              f"sizes {sorted({s['hora_sharded']['size'] for s in shards})}")
        state: dict[str, Any] = {}
        for s in shards:
            state.update(s["state"])
        groups = shards[0]["param_groups"]
    elif isinstance(state_dict, dict) and "hora_sharded" in state_dict:
        meta = state_dict["hora_sharded"]
        if meta["size"] != len(opt._hora_ranks) or meta["rank"] != opt._hora_me:
            raise ConfigError(
                f"load_state_dict: this is the shard of rank {meta['rank']} of {meta['size']}, but this rank is "
                f"{opt._hora_me} of {len(opt._hora_ranks)}; pass every rank's shard (a list) or use "
                "load_sharded_state_dict(path) to reshard")
        state, groups = dict(state_dict["state"]), state_dict["param_groups"]
    elif isinstance(state_dict, dict) and "state" in state_dict and "param_groups" in state_dict:
        groups = state_dict["param_groups"]
        if len(groups) != len(ours):
            raise ConfigError(f"load_state_dict: the checkpoint has {len(groups)} param groups, this optimizer "
                              f"{len(ours)}")
        by_id: dict[Any, str] = {}
        for g, names in zip(groups, ours):
            if len(g["params"]) != len(names):
                raise ConfigError(f"load_state_dict: a param group of the checkpoint has {len(g['params'])} "
                                  f"parameters, this optimizer's {len(names)} (first: {names[:1]})")
            by_id.update(zip(g["params"], names))
        state = {by_id[i]: st for i, st in state_dict["state"].items()}
        groups = [{**_hyper(g), "params": names} for g, names in zip(groups, ours)]
    else:
        raise ConfigError(f"load_state_dict: expected a state dict, got {type(state_dict).__name__}")
    theirs = [list(g["params"]) for g in groups]
    if theirs != ours:
        flat_o = [n for g in ours for n in g]
        flat_t = [n for g in theirs for n in g]
        first = next((f"{t!r} where this model has {o!r}" for o, t in zip(flat_o, flat_t) if o != t),
                     f"{len(flat_t)} parameters where this model has {len(flat_o)}")
        raise ConfigError(f"load_state_dict: the checkpoint is of another model: parameter {first}")
    params = {opt._hora_names[p]: p for g in opt.param_groups for p in g["params"]}
    for name, st in state.items():
        p = params[name]
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape != p.shape:
                raise ConfigError(f"load_state_dict: the state {k!r} of parameter {name!r} has shape "
                                  f"{tuple(v.shape)}, the parameter {tuple(p.shape)} (another model?)")
    return state, groups


def load_into(opt: Any, state_dict: Any) -> None:
    """Load ``state_dict`` (see :meth:`_ShardedMixin.load_state_dict`) into ``opt``."""
    state, groups = _merge(state_dict, opt)
    for outer, g in zip(opt.param_groups, groups):
        outer.update(_hyper(g))
    names = opt._hora_names
    params = _inner_params(opt)
    index = {p: i for i, p in enumerate(params)}
    inner_groups = [{**_hyper(g), "params": [index[p] for p in ig["params"]]}
                    for g, ig in zip(groups, opt._hora_inner.param_groups)]
    inner_state = {index[p]: state[names[p]] for p in params if names[p] in state}
    opt._hora_inner.load_state_dict({"state": inner_state, "param_groups": inner_groups})
    opt.state = opt._hora_inner.state  # torch replaced the state dict object


def _shard_name(rank: int, size: int) -> str:
    return f"shard-{rank:05d}-of-{size:05d}.pt"


def save_shard(opt: Any, path: str, store: Any = None) -> str:
    """Write this rank's shard atomically under folder ``path``; returns the file's path."""
    buf = io.BytesIO()
    torch.save(shard_state_dict(opt), buf)
    name = _shard_name(opt._hora_me, len(opt._hora_ranks))
    if store is not None:
        from hora.store import integrity

        target = f"{str(path).rstrip('/')}/{name}"
        integrity.save_checkpoint(store, target, buf.getvalue())  # with its checksum record
        return target
    folder = os.fspath(path)
    os.makedirs(folder, exist_ok=True)
    target = os.path.join(folder, name)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(buf.getvalue())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


def read_shards(path: str, store: Any = None) -> list[dict[str, Any]]:
    """Every shard saved under folder ``path`` (by any number of ranks).

    Raises:
        StoreError: no shard there, shards of two sizes, or some missing.
        DataError: a shard in a Store no longer matches its checksum (names it).
    """
    folder = str(path).rstrip("/") if store is not None else os.fspath(path)
    try:
        entries = store.listdir(folder) if store is not None else os.listdir(folder)
    except (FileNotFoundError, StoreError) as exc:
        raise StoreError(f"no sharded optimizer checkpoint at {folder!r}: {exc}") from None
    found: dict[int, dict[int, str]] = {}
    for e in entries:
        m = _SHARD_FILE.match(os.path.basename(str(e).rstrip("/")))
        if m:
            found.setdefault(int(m.group(2)), {})[int(m.group(1))] = os.path.basename(str(e).rstrip("/"))
    if len(found) != 1:
        raise StoreError(f"sharded optimizer checkpoint at {folder!r}: expected the shards of one save, found "
                         f"sizes {sorted(found) or 'none'}")
    size, files = found.popitem()
    missing = sorted(set(range(size)) - set(files))
    if missing:
        raise StoreError(f"sharded optimizer checkpoint at {folder!r}: the shards of ranks {missing} of {size} "
                         "are missing")
    shards = []
    for r in range(size):
        if store is not None:
            from hora.store import integrity

            shard = f"{folder}/{files[r]}"
            data = integrity.read_checkpoint(store, shard, f"optimizer shard {store.url_for(shard)}")
        else:
            with open(os.path.join(folder, files[r]), "rb") as fh:
                data = fh.read()
        shards.append(torch.load(io.BytesIO(data), map_location="cpu", weights_only=False))
    return shards
