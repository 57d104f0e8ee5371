"""Parameter bookkeeping shared by the distributed optimizers: the names gradients are
matched under, Horovod's explicit ``groups``, and words for where two ranks' layouts part."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hora.errors import ConfigError


def normalize_named_parameters(
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
    param_groups: list[dict[str, Any]],
) -> dict[torch.Tensor, str]:
    """Map each optimizer parameter to the name its gradient is reduced under.

    Raises:
        ConfigError: items are not ``(str, Tensor)`` pairs, a name occurs twice, or a
            parameter of the optimizer is missing from ``named_parameters``.
    """
    names: dict[int, str] = {}
    if named_parameters is None:
        for gi, group in enumerate(param_groups):
            for pi, p in enumerate(group["params"]):
                names.setdefault(id(p), f"noname.{gi}.{pi}")
    else:
        if isinstance(named_parameters, dict):
            items = list(named_parameters.items())
        else:
            try:
                items = list(named_parameters)
            except TypeError:
                raise ConfigError(
                    "named_parameters must be a sequence of (name, parameter) pairs such as "
                    f"model.named_parameters(), got {type(named_parameters).__name__}"
                ) from None
        seen: dict[str, int] = {}
        for i, item in enumerate(items):
            if not (
                isinstance(item, tuple)
                and len(item) == 2
                and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)
            ):
                raise ConfigError(
                    "named_parameters must be a sequence of (name, parameter) pairs such as "
                    f"model.named_parameters(); item {i} is {type(item).__name__}: {item!r:.80}"
                )
            name, p = item
            if name in seen:
                raise ConfigError(
                    f"named_parameters holds the name {name!r} twice (items {seen[name]} and {i}); "
                    "every parameter name must be unique because gradients are matched across "
                    "ranks by name"
                )
            seen[name] = i
            names.setdefault(id(p), name)
        missing = []
        for gi, group in enumerate(param_groups):
            for pi, p in enumerate(group["params"]):
                if id(p) not in names:
                    missing.append(f"param_groups[{gi}]['params'][{pi}] (shape {tuple(p.shape)})")
        if missing:
            raise ConfigError(
                "named_parameters was given but does not name these parameters of the "
                f"optimizer: {', '.join(missing)}; pass model.named_parameters() of the model "
                "that owns every optimized parameter"
            )
    return {p: names[id(p)] for group in param_groups for p in group["params"]}


def explicit_groups(groups: Any, params: list[torch.Tensor]) -> list[list[torch.Tensor]] | None:
    """Horovod's ``groups`` as lists of ``params`` reduced together: ``None`` (no explicit
    groups), a number of groups to split ``params`` into (in order, as even as possible),
    or lists of parameters (every parameter not listed is a group of its own).

    Raises:
        ConfigError: ``groups`` is neither, a listed item is not a tensor, or a parameter
            is listed twice (a ValueError, as Horovod's).
    """
    if groups is None or (isinstance(groups, int) and not isinstance(groups, bool) and groups == 0):
        return None
    if isinstance(groups, int) and not isinstance(groups, bool) and groups > 0:
        n = min(groups, len(params)) or 1
        size, extra = divmod(len(params), n)
        out, start = [], 0
        for i in range(n):
            end = start + size + (1 if i < extra else 0)
            out.append(params[start:end])
            start = end
        return [g for g in out if g]
    if not isinstance(groups, list):
        raise ConfigError(f"groups should be a non-negative integer or a list of list of torch.Tensor, "
                          f"got {type(groups).__name__}")
    seen: set[int] = set()
    wanted = {id(p) for p in params}
    out = []
    for group in groups:
        members = []
        for p in group:
            if not isinstance(p, torch.Tensor):
                raise ConfigError(f"groups must consist of torch.Tensor, got {type(p).__name__}")
            if id(p) in seen:
                raise ConfigError("A parameter can only appear once in groups.")
            seen.add(id(p))
            if id(p) in wanted:
                members.append(p)
        if members:
            out.append(members)
    out.extend([p] for p in params if id(p) not in seen)
    return out


def first_difference(mine: list[Any] | None, theirs: list[Any] | None) -> str:
    """Words for where two bucket layouts (lists of (name, shape, dtype)) part."""
    if mine is None or theirs is None:
        which = "this rank" if mine is None else "that rank"
        return f"{which} has no flat buffer for it (mine: {mine!r:.200}, theirs: {theirs!r:.200})"
    for i in range(max(len(mine), len(theirs))):
        a = mine[i] if i < len(mine) else None
        o = theirs[i] if i < len(theirs) else None
        if a != o:
            return f"entry {i} is {a} here and {o} there"
    return "they differ"  # unreachable for unequal lists; kept total
