"""The frozen, picklable training spec: everything a training worker needs, and nothing else.

The driver builds one :class:`TrainSpec` per ``fit`` and the runner ships it to every
rank, which calls :func:`hora.estimators.worker.loop.train_worker` on it. The parameters
travel as the config's worker copy (:meth:`EstimatorConfig.for_workers`: the JSON
parameters, no field-by-field copy); the framework objects (model, optimizer, loss,
metrics) are frozen by the framework's codec into ``payload``, and callbacks and the
transformation function into ``common``, with cloudpickle when the spec is built, so
changes the user makes to them after ``fit`` starts cannot leak into the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from hora.errors import ConfigError
from hora.estimators import old_names


def freeze(obj: Any) -> bytes:
    """cloudpickle ``obj`` (by value for ``__main__`` definitions).

    Raises:
        ConfigError: ``obj`` cannot be pickled. For a dict of parameters (what the codecs
            freeze) the message names the parameter (``loss``, ``model``, ``callbacks``...)
            and, where it can be found, the attribute path of the object that cannot be
            pickled (``loss.cache['lock']``).
    """
    try:
        return cloudpickle.dumps(obj)
    except Exception as exc:  # an unpicklable user object: name it
        where = _unpicklable_path(obj, "") if isinstance(obj, dict) else _unpicklable_path(obj, "the object")
        if where is not None:
            path, culprit = where
            name = path.split(".", 1)[0].split("[", 1)[0]
            raise ConfigError(f"cannot pickle the parameter {name!r} for the training workers: {path} (a "
                              f"{type(culprit).__module__}.{type(culprit).__qualname__}) cannot be pickled: "
                              f"{type(exc).__name__}: {exc}") from exc
        raise ConfigError(f"cannot pickle {type(obj).__name__} for the training workers: {type(exc).__name__}: {exc}") from exc


def _picklable(obj: Any) -> bool:
    try:
        cloudpickle.dumps(obj)
        return True
    except Exception:
        return False


def _children(obj: Any, path: str) -> list[tuple[str, Any]]:
    """``(path, value)`` of what ``obj`` holds: dict entries, sequence items, attributes
    (a torch module's submodules as ``.name``)."""
    if isinstance(obj, dict):
        return [(f"{path}.{k}" if not path and isinstance(k, str) else f"{path}[{k!r}]", v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
    state = getattr(obj, "__dict__", None)
    if not isinstance(state, dict):
        return []
    out = []
    for key, value in state.items():
        if key in ("_modules", "_parameters", "_buffers") and isinstance(value, dict):
            out.extend((f"{path}.{k}", v) for k, v in value.items() if v is not None)
        else:
            out.append((f"{path}.{key}", value))
    return out


def _unpicklable_path(obj: Any, path: str, depth: int = 0, seen: set[int] | None = None) -> tuple[str, Any] | None:
    """The deepest ``(path, object)`` below ``obj`` that cannot be pickled while everything it holds
    can (searched a few levels down), or None when ``obj`` pickles."""
    seen = set() if seen is None else seen
    if id(obj) in seen or (path and _picklable(obj)):
        return None
    seen.add(id(obj))
    if depth < 8:
        for child_path, child in _children(obj, path):
            found = _unpicklable_path(child, child_path.lstrip("."), depth + 1, seen)
            if found is not None:
                return found
    return (path, obj) if path else None


def thaw(data: bytes) -> Any:
    """Inverse of :func:`freeze` (a module named by its path before the estimators' subpackages is read at
    its new one: :mod:`hora.estimators.old_names`)."""
    return old_names.loads(data)


@dataclass(frozen=True)
class TrainSpec:
    """What every training worker runs (frozen; pickled once per fit).

    Attributes:
        framework: the :class:`~hora.estimators.framework.Framework` (travels by name).
        config: the worker copy of the configuration (JSON parameters; ``input_shapes``
            as the codec resolved them).
        payload: the framework objects frozen by the codec (``codec.freeze(config)``).
        common: frozen framework-neutral objects: ``{"callbacks": [...], "transformation_fn": fn}``.
        store: the hora Store; ``dataset``: the materialized :class:`~hora.store.DatasetInfo`.
        run_id: the run's id in the store; ``resume``: look for a checkpoint of this run first.
        num_proc: the number of ranks the driver asked for.
        output_shapes: per-row shape of each model output (from the driver's check).
        report_every: training steps between progress reports from rank 0.
    """

    framework: Any
    config: Any
    payload: bytes
    common: bytes
    store: Any
    dataset: Any
    run_id: str
    num_proc: int
    output_shapes: tuple[tuple[int, ...], ...] = ()
    resume: bool = True
    report_every: int = 10
    #: whether the dataset has a validation split (False when the framework brings its own data)
    has_val: bool = field(init=False, compare=False)
    #: the feature inputs (:class:`~hora.estimators.data.frames.Features`), the config's
    features: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # derived once, on the driver: every rank reads the fields
        object.__setattr__(self, "has_val", self.dataset is not None and bool(self.dataset.has_val))
        object.__setattr__(self, "features", self.config.features)


__all__ = ["TrainSpec", "freeze", "thaw"]
