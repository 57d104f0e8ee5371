"""Horovod's ``horovod.tensorflow.util`` helpers that programs and tests call."""

from __future__ import annotations

from typing import Any

from hora.tensorflow.bridge import executing_eagerly as _executing_eagerly


def vars_to_refs(variables: Any) -> Any:
    """Variables (nested in lists) as hashable references (``v.ref()``)."""
    if isinstance(variables, list):
        return tuple(vars_to_refs(v) for v in variables)
    return variables.ref()


def refs_to_vars(refs: Any) -> Any:
    """The inverse of :func:`vars_to_refs`."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()


__all__ = ["_executing_eagerly", "vars_to_refs", "refs_to_vars"]
