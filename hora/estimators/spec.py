"""The frozen, picklable training spec: everything a training worker needs, and nothing else.

The driver builds one :class:`TrainSpec` per ``fit`` and the runner ships it to every
rank, which calls :func:`hora.estimators.worker.train_worker` on it. The parameters
travel as the config's worker copy (:meth:`EstimatorConfig.for_workers`: the JSON
parameters, no field-by-field copy); the framework objects (model, optimizer, loss,
metrics) are frozen by the framework's codec into ``payload``, and callbacks and the
transformation function into ``common``, with cloudpickle when the spec is built, so
changes the user makes to them after ``fit`` starts cannot leak into the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cloudpickle

from hora.errors import ConfigError


def freeze(obj: Any) -> bytes:
    """cloudpickle ``obj`` (by value for ``__main__`` definitions).

    Raises:
        ConfigError: ``obj`` cannot be pickled (names its type).
    """
    try:
        return cloudpickle.dumps(obj)
    except Exception as exc:  # an unpicklable user object: name it
        raise ConfigError(f"cannot pickle {type(obj).__name__} for the training workers: {type(exc).__name__}: {exc}") from exc


def thaw(data: bytes) -> Any:
    """Inverse of :func:`freeze`."""
    return cloudpickle.loads(data)


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

    @property
    def has_val(self) -> bool:
        """Whether the dataset has a validation split (False when the framework brings its own data)."""
        return self.dataset is not None and bool(self.dataset.has_val)

    @property
    def features(self) -> Any:
        """The feature inputs (:class:`~hora.estimators.data.Features`)."""
        return self.config.features


__all__ = ["TrainSpec", "freeze", "thaw"]
