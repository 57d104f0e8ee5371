"""The estimator configuration shared by both faces: one dataclass, validated in ``__post_init__``.

``hora.spark.TorchEstimator`` (Spark Params) and ``hora.dask.TorchEstimator``
(scikit-learn style arguments) both turn their parameters into an
:class:`EstimatorConfig` at ``fit`` time; everything after that is engine-neutral.

Learning-rate scaling policy
----------------------------
With ``lr_scaling="linear"`` (the default, as in Horovod) every optimizer parameter
group's learning rate is multiplied by the number of training processes
(``num_proc``) on the workers, because the effective batch is ``num_proc`` times the
per-rank ``batch_size``. ``lr_scaling="none"`` keeps the learning rate as given.
``learning_rate``, when set, replaces the optimizer's learning rate (of every group)
*before* scaling; it exists so ``ParamGridBuilder`` can search over it.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from hora.errors import ConfigError

LR_SCALING_POLICIES = ("linear", "none")

#: Parameter names, in a stable order, with their defaults (what both faces expose).
PARAM_DEFAULTS: dict[str, Any] = {
    "num_proc": None,
    "store": None,
    "model": None,
    "optimizer": None,
    "loss": None,
    "loss_weights": None,
    "metrics": None,
    "feature_cols": None,
    "label_cols": None,
    "sample_weight_col": None,
    "validation": None,
    "batch_size": 32,
    "val_batch_size": None,
    "epochs": 1,
    "train_steps_per_epoch": None,
    "validation_steps_per_epoch": None,
    "shuffle": True,
    "shuffle_buffer_size": None,
    "random_seed": None,
    "run_id": None,
    "callbacks": None,
    "gradient_compression": None,
    "backward_passes_per_step": 1,
    "transformation_fn": None,
    "input_shapes": None,
    "use_gpu": False,
    "verbose": 1,
    "backend_env": None,
    "lr_scaling": "linear",
    "learning_rate": None,
    "output_cols": None,
    "start_timeout": None,
}

#: Params that are plain JSON values (persisted as Spark Params metadata); the others
#: (model, optimizer, callables, the store...) are pickled into side files.
JSON_PARAMS = frozenset(
    {
        "num_proc",
        "loss_weights",
        "feature_cols",
        "label_cols",
        "sample_weight_col",
        "validation",
        "batch_size",
        "val_batch_size",
        "epochs",
        "train_steps_per_epoch",
        "validation_steps_per_epoch",
        "shuffle",
        "shuffle_buffer_size",
        "random_seed",
        "run_id",
        "backward_passes_per_step",
        "input_shapes",
        "use_gpu",
        "verbose",
        "backend_env",
        "lr_scaling",
        "learning_rate",
        "output_cols",
        "start_timeout",
    }
)

PARAM_DOCS: dict[str, str] = {
    "num_proc": "number of training processes (ranks); default: the engine's parallelism",
    "store": "hora.store.Store (or a URL) where data is materialized and runs are kept",
    "model": "the model to train (a torch.nn.Module for TorchEstimator)",
    "optimizer": "an optimizer bound to the model's parameters, or a factory params -> optimizer",
    "loss": "loss callable (output, label) -> scalar tensor, or a list with one per label",
    "loss_weights": "weights of the per-label losses (one float per label)",
    "metrics": "metric callables (output, label) -> tensor or torchmetrics Metrics; a list or a {name: metric} dict",
    "feature_cols": "feature column names; the model is called as model(*features)",
    "label_cols": "label column names; one model output per label",
    "sample_weight_col": "column of per-row loss weights",
    "validation": "fraction of rows held out for validation, or the name of a boolean column",
    "batch_size": "rows per training batch on each rank",
    "val_batch_size": "rows per validation batch (default: batch_size)",
    "epochs": "number of passes over the training data",
    "train_steps_per_epoch": "training batches per epoch (default: one pass over each rank's share)",
    "validation_steps_per_epoch": "validation batches per epoch (default: all)",
    "shuffle": "shuffle the training data every epoch",
    "shuffle_buffer_size": "rows mixed in memory by the reader's shuffle",
    "random_seed": "seed of model init on the workers, the validation split and the shuffles",
    "run_id": "name of the run in the store; fitting with an existing run_id resumes from its last checkpoint",
    "callbacks": "list of hora.estimators.callbacks.Callback objects",
    "gradient_compression": "gradient compression for allreduce (e.g. hora.native.compression.fp16)",
    "backward_passes_per_step": "gradient accumulation: backward passes per optimizer step",
    "transformation_fn": "function applied to every batch (dict of numpy arrays -> dict) on the workers",
    "input_shapes": "shape of each feature input including the batch dimension, e.g. [[-1, 1, 8, 8]]",
    "use_gpu": "train on the GPU of each worker (one GPU per rank)",
    "verbose": "0: quiet, 1: progress bar and epoch logs, 2: also batch logs",
    "backend_env": "extra environment variables for the training workers",
    "lr_scaling": "'linear' (default): multiply the learning rate by num_proc, as Horovod does; 'none'",
    "learning_rate": "learning rate overriding the optimizer's (before scaling); for parameter searches",
    "output_cols": "prediction column names (default 'prediction' for one label, '<label>__output' for several)",
    "start_timeout": "seconds to wait for every worker to start",
}


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _str_list(name: str, value: Any, allow_empty: bool = False) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    try:
        items = tuple(value)
    except TypeError as exc:
        raise ConfigError(f"{name} must be a list of column names, got {value!r}") from exc
    for item in items:
        if not isinstance(item, str) or not item:
            raise ConfigError(f"{name} must hold non-empty column name strings, got {item!r}")
    if not items and not allow_empty:
        raise ConfigError(f"{name} must name at least one column")
    if len(set(items)) != len(items):
        raise ConfigError(f"{name} has duplicate names: {list(items)}")
    return items


def _positive_int(name: str, value: Any, allow_none: bool = True, minimum: int = 1) -> int | None:
    if value is None and allow_none:
        return None
    if not _is_int(value) or int(value) < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


@dataclass
class EstimatorConfig:
    """Validated training configuration (see :data:`PARAM_DOCS` for each field).

    Construction validates every field that can be checked without the data or
    the framework; the framework trainer checks the model, optimizer and loss, and
    the core checks columns and shapes against the DataFrame.

    Raises:
        ConfigError: a field has a bad value; the message names the field.
    """

    num_proc: int | None = None
    store: Any = None
    model: Any = None
    optimizer: Any = None
    loss: Any = None
    loss_weights: Sequence[float] | None = None
    metrics: Any = None
    feature_cols: Sequence[str] | None = None
    label_cols: Sequence[str] | None = None
    sample_weight_col: str | None = None
    validation: float | str | None = None
    batch_size: int = 32
    val_batch_size: int | None = None
    epochs: int = 1
    train_steps_per_epoch: int | None = None
    validation_steps_per_epoch: int | None = None
    shuffle: bool = True
    shuffle_buffer_size: int | None = None
    random_seed: int | None = None
    run_id: str | None = None
    callbacks: Sequence[Any] | None = None
    gradient_compression: Any = None
    backward_passes_per_step: int = 1
    transformation_fn: Callable | None = None
    input_shapes: Sequence[Sequence[int]] | None = None
    use_gpu: bool = False
    verbose: int = 1
    backend_env: dict[str, str] | None = None
    lr_scaling: str = "linear"
    learning_rate: float | None = None
    output_cols: Sequence[str] | None = None
    start_timeout: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.num_proc = _positive_int("num_proc", self.num_proc)
        if self.store is None:
            raise ConfigError("store is required: pass store=hora.store.Store.create(url) (or a store URL)")
        if isinstance(self.store, str):
            from hora.store import Store

            self.store = Store.create(self.store)
        else:
            from hora.store import Store

            if not isinstance(self.store, Store):
                raise ConfigError(f"store must be a hora.store.Store or a URL string, got {type(self.store).__name__}")
        if self.model is None:
            raise ConfigError("model is required")
        if self.optimizer is None:
            raise ConfigError("optimizer is required: an optimizer bound to the model's parameters, or a factory")
        if self.loss is None:
            raise ConfigError("loss is required: a callable (output, label) -> scalar, or one per label")
        feats = _str_list("feature_cols", self.feature_cols)
        if feats is None:
            raise ConfigError("feature_cols is required: the names of the feature columns")
        self.feature_cols = list(feats)
        labels = _str_list("label_cols", self.label_cols)
        if labels is None:
            raise ConfigError("label_cols is required: the names of the label columns")
        self.label_cols = list(labels)
        overlap = set(self.feature_cols) & set(self.label_cols)
        if overlap:
            raise ConfigError(f"columns {sorted(overlap)} are both in feature_cols and label_cols")
        if self.sample_weight_col is not None and (not isinstance(self.sample_weight_col, str) or not self.sample_weight_col):
            raise ConfigError(f"sample_weight_col must be a column name, got {self.sample_weight_col!r}")

        n_labels = len(self.label_cols)
        if isinstance(self.loss, (list, tuple)):
            if len(self.loss) != n_labels:
                raise ConfigError(f"loss has {len(self.loss)} entries but there are {n_labels} label_cols {self.label_cols}")
            for i, fn in enumerate(self.loss):
                if not callable(fn):
                    raise ConfigError(f"loss[{i}] (for label {self.label_cols[i]!r}) is not callable: {fn!r}")
        elif not callable(self.loss):
            raise ConfigError(f"loss must be callable or a list of callables, got {self.loss!r}")
        if self.loss_weights is not None:
            try:
                weights = [float(w) for w in self.loss_weights]
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"loss_weights must be a list of numbers, got {self.loss_weights!r}") from exc
            if len(weights) != n_labels:
                raise ConfigError(f"loss_weights has {len(weights)} entries but there are {n_labels} label_cols")
            self.loss_weights = weights

        if self.validation is not None and not isinstance(self.validation, str):
            if isinstance(self.validation, bool) or not isinstance(self.validation, numbers.Real):
                raise ConfigError(f"validation must be a fraction in [0, 1) or a column name, got {self.validation!r}")
            if not 0.0 <= float(self.validation) < 1.0:
                raise ConfigError(f"validation fraction must be in [0, 1), got {self.validation!r}")
            self.validation = float(self.validation) or None

        if not _is_int(self.batch_size) or self.batch_size <= 0:
            raise ConfigError(f"batch_size must be an integer > 0, got {self.batch_size!r}")
        self.val_batch_size = _positive_int("val_batch_size", self.val_batch_size)
        if not _is_int(self.epochs) or self.epochs < 1:
            raise ConfigError(f"epochs must be an integer >= 1, got {self.epochs!r}")
        self.train_steps_per_epoch = _positive_int("train_steps_per_epoch", self.train_steps_per_epoch)
        self.validation_steps_per_epoch = _positive_int("validation_steps_per_epoch", self.validation_steps_per_epoch)
        if not isinstance(self.shuffle, bool):
            raise ConfigError(f"shuffle must be True or False, got {self.shuffle!r}")
        self.shuffle_buffer_size = _positive_int("shuffle_buffer_size", self.shuffle_buffer_size)
        if self.random_seed is not None and not _is_int(self.random_seed):
            raise ConfigError(f"random_seed must be an integer, got {self.random_seed!r}")
        if self.run_id is not None:
            from hora.store.layout import _check_name

            _check_name("run_id", self.run_id)
        cbs = list(self.callbacks or [])
        for cb in cbs:
            from hora.estimators.callbacks import Callback

            if not isinstance(cb, Callback):
                raise ConfigError(f"callbacks must be hora.estimators.callbacks.Callback instances, got {cb!r}")
        self.callbacks = cbs
        self.backward_passes_per_step = _positive_int("backward_passes_per_step", self.backward_passes_per_step, False)
        if self.transformation_fn is not None and not callable(self.transformation_fn):
            raise ConfigError(f"transformation_fn must be callable, got {self.transformation_fn!r}")
        if self.input_shapes is not None:
            shapes = []
            for shape in self.input_shapes:
                try:
                    dims = [int(d) for d in shape]
                except (TypeError, ValueError) as exc:
                    raise ConfigError(f"input_shapes must be a list of shapes (lists of ints), got {self.input_shapes!r}") from exc
                shapes.append(dims)
            if len(shapes) != len(self.feature_cols):
                raise ConfigError(
                    f"input_shapes has {len(shapes)} shapes but there are {len(self.feature_cols)} feature_cols {self.feature_cols}"
                )
            self.input_shapes = shapes
        if not isinstance(self.use_gpu, bool):
            raise ConfigError(f"use_gpu must be True or False, got {self.use_gpu!r}")
        if not _is_int(self.verbose) or self.verbose < 0:
            raise ConfigError(f"verbose must be an integer >= 0, got {self.verbose!r}")
        if self.backend_env is not None:
            if not isinstance(self.backend_env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.backend_env.items()
            ):
                raise ConfigError(f"backend_env must be a dict of str -> str, got {self.backend_env!r}")
        if self.lr_scaling not in LR_SCALING_POLICIES:
            raise ConfigError(f"lr_scaling must be one of {LR_SCALING_POLICIES}, got {self.lr_scaling!r}")
        if self.learning_rate is not None:
            if isinstance(self.learning_rate, bool) or not isinstance(self.learning_rate, numbers.Real) or self.learning_rate <= 0:
                raise ConfigError(f"learning_rate must be a number > 0, got {self.learning_rate!r}")
            self.learning_rate = float(self.learning_rate)
        if self.output_cols is not None:
            outs = _str_list("output_cols", self.output_cols)
            if len(outs) != n_labels:
                raise ConfigError(f"output_cols has {len(outs)} names but there are {n_labels} label_cols")
            self.output_cols = list(outs)
        if self.start_timeout is not None:
            if isinstance(self.start_timeout, bool) or not isinstance(self.start_timeout, numbers.Real) or self.start_timeout <= 0:
                raise ConfigError(f"start_timeout must be a number of seconds > 0, got {self.start_timeout!r}")

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "EstimatorConfig":
        """Build from a ``{name: value}`` dict; unknown names raise ConfigError."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(params) - names
        if unknown:
            raise ConfigError(f"unknown estimator parameters: {sorted(unknown)}")
        return cls(**params)

    def resolved_output_cols(self) -> list[str]:
        """The prediction column names: ``output_cols`` or the default naming."""
        return default_output_cols(self.label_cols, self.output_cols)


def default_output_cols(label_cols: Sequence[str], output_cols: Sequence[str] | None = None) -> list[str]:
    """``output_cols`` if given, else ``["prediction"]`` for one label and ``["<label>__output", ...]`` for several."""
    if output_cols:
        return list(output_cols)
    if len(label_cols) == 1:
        return ["prediction"]
    return [f"{c}__output" for c in label_cols]


__all__ = ["EstimatorConfig", "PARAM_DEFAULTS", "PARAM_DOCS", "JSON_PARAMS", "LR_SCALING_POLICIES", "default_output_cols"]
