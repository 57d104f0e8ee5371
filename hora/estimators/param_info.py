"""How an estimator parameter is declared: one dataclass field made by :func:`param`, carrying a
:class:`ParamInfo` (doc, how it is persisted, what hora does instead of a Horovod knob), and what is
derived from the fields (defaults, types, docs, the JSON and unsaved sets), and :func:`keyword_params`,
the decorator of the estimators' constructors. The parameters themselves are declared in
:mod:`hora.estimators.params`."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from hora.errors import ConfigError

JSON, PICKLE, NONE = "json", "pickle", "none"
_F = TypeVar("_F", bound=Callable[..., Any])


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
    """``{name: annotation}`` of a config class, as declared (the text, unevaluated)."""
    return {f.name: f.type if isinstance(f.type, str) else inspect.formatannotation(f.type) for f in param_fields(cls)}


def param_signature(cls: type, *, with_self: bool = True, return_annotation: Any = None) -> inspect.Signature:
    """The signature a constructor taking ``cls``'s parameters has: each keyword-only, with its
    declared type and default (the estimator classes write it out; tests compare them to it)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation that does not evaluate here: show its text
        hints = {}
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] if with_self else []
    params += [inspect.Parameter(f.name, kw, default=f.default, annotation=hints.get(f.name, f.type))
               for f in param_fields(cls)]
    return inspect.Signature(params, return_annotation=return_annotation)


def keyword_params(method: _F) -> _F:
    """Decorate an estimator's ``__init__`` or ``setParams`` written with every parameter keyword-only.

    As pyspark's ``keyword_only``: positional arguments are refused and the keywords given
    are saved in ``self._input_kwargs`` (the parameters set explicitly, as Spark tells them
    from defaults). Before the call, ``self._check_keywords(kwargs)`` checks the names and
    returns them as the method takes them (MLlib's ``predictionCol`` as ``prediction_col``),
    so an unknown name raises :class:`ParamError` saying what to use instead (Horovod's
    keywords, a close name) rather than Python's bare TypeError.
    """

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError(f"{type(self).__name__}.{method.__name__} takes keyword arguments only, "
                            f"got {len(args)} positional")
        self._input_kwargs = kwargs = self._check_keywords(kwargs)
        return method(self, **kwargs)

    return typing.cast(_F, wrapper)


def param_docs(cls: type) -> dict[str, str]:
    """``{name: doc}`` of a config class."""
    return {f.name: f.metadata["hora"].doc for f in param_fields(cls)}


def params_section(doc: str | None, cls: type, heading: str) -> str:
    """The docstring ``doc`` with a section listing every parameter of the config class ``cls`` and
    its doc (each estimator class gets it, so ``help()`` shows what every keyword does)."""
    items = "\n".join(f"* ``{n}``: {d}" for n, d in param_docs(cls).items())
    return f"{inspect.cleandoc(doc or '')}\n\n{heading}:\n\n{items}\n"


def json_params(cls: type) -> frozenset[str]:
    """Names of the parameters persisted as JSON metadata (the others are pickled side files or not saved)."""
    return frozenset(f.name for f in param_fields(cls) if f.metadata["hora"].persist == JSON)


def unsaved_params(cls: type) -> frozenset[str]:
    """Names of the parameters never persisted (recreated for each run)."""
    return frozenset(f.name for f in param_fields(cls) if f.metadata["hora"].persist == NONE)


__all__ = ["ParamError", "ParamInfo", "param", "param_fields", "param_defaults", "param_types", "param_signature",
           "keyword_params", "param_docs", "params_section", "json_params", "unsaved_params", "JSON", "PICKLE", "NONE"]
