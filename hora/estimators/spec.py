"""The frozen, picklable training spec: everything a training worker needs, and nothing else.

The driver builds one :class:`TrainSpec` per ``fit`` and the runner ships it to every
rank, which calls :func:`hora.estimators.worker.train_worker` on it. Framework objects
(model, optimizer, loss, metrics, callbacks, transformation function, compression)
are frozen into ``payload`` bytes with cloudpickle when the spec is built, so changes
the user makes to them after ``fit`` starts cannot leak into the run, and every rank
unpickles its own copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from hora.errors import ConfigError


def freeze(obj: Any) -> bytes:
    """cloudpickle ``obj`` (by value for ``__main__`` definitions)."""
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
        trainer: the framework hooks object (e.g. :class:`~hora.estimators.torch_trainer.TorchTrainer`).
        payload: frozen framework objects (``trainer.freeze_payload(config)``), opened
            on the worker by ``trainer.setup``.
        common: frozen framework-neutral objects: ``{"callbacks": [...], "transformation_fn": fn}``.
        store: the hora Store; ``dataset``: the materialized :class:`~hora.store.DatasetInfo`.
        run_id: the run's id in the store; ``resume``: look for a checkpoint of this run first.
        num_proc: the number of ranks the driver asked for.
        feature_cols, label_cols, sample_weight_col: column names.
        input_shapes: per-feature shapes (with ``-1`` batch dimension) or None.
        batch_size, val_batch_size, epochs, train_steps_per_epoch, validation_steps_per_epoch,
        shuffle, shuffle_buffer_size, seed, backward_passes_per_step, use_gpu, verbose,
        lr_scaling, learning_rate, loss_weights: see :mod:`hora.estimators.params`.
        report_every: training steps between progress reports from rank 0.
    """

    trainer: Any
    payload: bytes
    common: bytes
    store: Any
    dataset: Any
    run_id: str
    num_proc: int
    feature_cols: tuple[str, ...]
    label_cols: tuple[str, ...]
    sample_weight_col: str | None = None
    input_shapes: tuple[tuple[int, ...], ...] | None = None
    batch_size: int = 32
    val_batch_size: int = 32
    epochs: int = 1
    train_steps_per_epoch: int | None = None
    validation_steps_per_epoch: int | None = None
    shuffle: bool = True
    shuffle_buffer_size: int | None = None
    seed: int = 0
    backward_passes_per_step: int = 1
    use_gpu: bool = False
    verbose: int = 1
    lr_scaling: str = "linear"
    learning_rate: float | None = None
    loss_weights: tuple[float, ...] | None = None
    resume: bool = True
    report_every: int = 10
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def has_val(self) -> bool:
        """Whether the dataset has a validation split."""
        return bool(self.dataset.has_val)


__all__ = ["TrainSpec", "freeze", "thaw"]
