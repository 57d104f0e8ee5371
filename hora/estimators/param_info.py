"""How an estimator parameter is declared: one dataclass field made by :func:`param`, carrying a
:class:`ParamInfo` (doc, how it is persisted, what hora does instead of a Horovod knob), and what is
derived from the fields (defaults, types, docs, the Dask signature, the JSON and unsaved sets).
The parameters themselves are declared in :mod:`hora.estimators.params`."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass, field
from typing import Any

from hora.errors import ConfigError

JSON, PICKLE, NONE = "json", "pickle", "none"


class ParamError(ConfigError, TypeError):
    """A keyword the estimator does not take (a ConfigError, and a TypeError as Python raises for one)."""


@dataclass(frozen=True)
class ParamInfo:
    """What a parameter is, beyond its type and default.

    Attributes:
        doc: one line for users (Spark Param doc, docstrings).
        persist: ``"json"`` (Spark metadata / saved JSON), ``"pickle"`` (a side file) or
            ``"none"`` (never saved: recreated for each run, as Horovod's ``backend``).
        ignored: for Horovod's petastorm knobs, what hora does instead; setting one logs
            this once.
    """

    doc: str
    persist: str = JSON
    ignored: str | None = None


def param(default: Any, doc: str, persist: str = JSON, ignored: str | None = None) -> Any:
    """A dataclass field declaring one estimator parameter."""
    return field(default=default, metadata={"hora": ParamInfo(doc, persist, ignored)})


def param_fields(cls: type) -> list[dataclasses.Field]:
    """The parameter fields of a config class, in declaration order."""
    return [f for f in dataclasses.fields(cls) if "hora" in f.metadata]


def param_defaults(cls: type) -> dict[str, Any]:
    """``{name: default}`` of a config class."""
    return {f.name: f.default for f in param_fields(cls)}


def param_types(cls: type) -> dict[str, str]:
    """``{name: annotation}`` of a config class, as declared (the text the stubs show)."""
    return {f.name: f.type if isinstance(f.type, str) else inspect.formatannotation(f.type) for f in param_fields(cls)}


def param_signature(cls: type, *, with_self: bool = True, return_annotation: Any = None) -> inspect.Signature:
    """The signature of a constructor taking ``cls``'s parameters: each keyword-only, with its
    declared type and default (what ``inspect.signature``, ``help()`` and IDEs show)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation that does not evaluate here: show its text
        hints = {}
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] if with_self else []
    params += [inspect.Parameter(f.name, kw, default=f.default, annotation=hints.get(f.name, f.type))
               for f in param_fields(cls)]
    return inspect.Signature(params, return_annotation=return_annotation)


def param_docs(cls: type) -> dict[str, str]:
    """``{name: doc}`` of a config class."""
    return {f.name: f.metadata["hora"].doc for f in param_fields(cls)}


def json_params(cls: type) -> frozenset[str]:
    """Names of the parameters persisted as JSON metadata (the others are pickled side files or not saved)."""
    return frozenset(f.name for f in param_fields(cls) if f.metadata["hora"].persist == JSON)


def unsaved_params(cls: type) -> frozenset[str]:
    """Names of the parameters never persisted (recreated for each run)."""
    return frozenset(f.name for f in param_fields(cls) if f.metadata["hora"].persist == NONE)


__all__ = ["ParamError", "ParamInfo", "param", "param_fields", "param_defaults", "param_types", "param_signature",
           "param_docs", "json_params", "unsaved_params", "JSON", "PICKLE", "NONE"]
