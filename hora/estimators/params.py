"""Estimator parameters, each declared once: one dataclass field with its default, doc and persistence.

:class:`EstimatorConfig` declares the parameters every framework shares; a framework
subclasses it for its own (``KerasConfig.custom_objects``). Each field is made by
:func:`param` and carries a :class:`ParamInfo` (doc, how it is persisted, and for
Horovod's petastorm knobs what hora does instead). Everything else is derived from
the fields: the defaults and docs (:func:`param_defaults`, :func:`param_docs`), the
Spark Params and the Dask constructor signature of the faces, the JSON metadata set
(:func:`json_params`), and the workers' copy of the config (:meth:`EstimatorConfig.for_workers`).

Learning-rate scaling policy
----------------------------
With ``lr_scaling="linear"`` (the default, as in Horovod) every optimizer parameter
group's learning rate is multiplied by the number of training processes on the
workers, because the effective batch is ``num_proc`` times the per-rank
``batch_size``. ``lr_scaling="none"`` keeps the learning rate as given.
``learning_rate``, when set, replaces the optimizer's learning rate *before* scaling;
it exists so ``ParamGridBuilder`` can search over it.
"""

from __future__ import annotations

import copy
import difflib
import logging
import numbers
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from hora.errors import ConfigError
from hora.estimators.data.frames import Features
from hora.estimators.param_info import (  # noqa: F401  (this module's names too)
    JSON, NONE, PICKLE, ParamError, ParamInfo, json_params, param, param_defaults, param_docs, param_fields,
    param_signature, param_types, unsaved_params)
from hora.runners.resolution import LAUNCHER_NAMES, check_backend  # backend='s shapes are told apart there

logger = logging.getLogger(__name__)

LR_SCALING_POLICIES = ("linear", "none")
#: ``task=`` values (None: inferred from the loss, see :mod:`hora.estimators.tasks`).
TASKS = (None, "classification", "regression", "causal_lm")
#: a classifier's output column parameters, and MLlib's names for them (accepted as keywords too).
CLASSIFIER_COLS = ("prediction_col", "probability_col", "raw_prediction_col")
MLLIB_ALIASES = {"predictionCol": "prediction_col", "probabilityCol": "probability_col",
                 "rawPredictionCol": "raw_prediction_col"}


#: Horovod estimator keywords hora does not take, with what to do instead.
HOROVOD_UNSUPPORTED: dict[str, str] = {
    "continuous_cols": "NVTabular's column roles are not used by hora: list the columns in feature_cols "
                       "(a feature group, a list inside feature_cols, stacks scalar columns into one input)",
    "categorical_cols": "NVTabular's column roles are not used by hora: index/encode categorical columns and list "
                        "them in feature_cols",
    "data_module": "hora reads the materialized Parquet with its own reader (hora.store); shape batches with "
                   "transformation_fn",
    "label_shapes": "hora reshapes each label to its model output when their values per row match; reshape other "
                    "labels in transformation_fn",
    "loss_constructors": "pass the losses themselves as loss=",
    "tensorflow_dataset_prefetch_buffer_size": "only the Keras estimator takes it",
    "custom_objects": "only the Keras estimator takes it",
    "checkpoint_callback": "only the Keras estimator takes it (Lightning: put a ModelCheckpoint in callbacks)",
    "train_minibatch_fn": "only the Torch estimator takes it (Lightning: write training_step)",
}

_IGNORED = "Horovod's petastorm reader knob; hora's reader has none: "
_warned: set[str] = set()


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _str_list(name: str, value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    try:
        items = list(value)
    except TypeError as exc:
        raise ConfigError(f"{name} must be a list of column names, got {value!r}") from exc
    for item in items:
        if not isinstance(item, str) or not item:
            raise ConfigError(f"{name} must hold non-empty column name strings, got {item!r}")
    if not items:
        raise ConfigError(f"{name} must name at least one column")
    if len(set(items)) != len(items):
        raise ConfigError(f"{name} has duplicate names: {items}")
    return items


def _positive_int(name: str, value: Any, allow_none: bool = True, minimum: int = 1) -> int | None:
    if value is None and allow_none:
        return None
    if not _is_int(value) or int(value) < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _positive_number(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0:
        raise ConfigError(f"{name} must be a number > 0, got {value!r}")
    return float(value)


_EVERY = re.compile(r"^\s*(\d+)\s*(epochs?|steps?)\s*$")


def checkpoint_interval(value: Any) -> tuple[int, str]:
    """``checkpoint_every`` as ``(n, "epochs" | "steps")``: an int N is N epochs, a string
    ``"N steps"`` (or ``"N epochs"``) says which.

    Raises:
        ConfigError: anything else, or N < 1.
    """
    if _is_int(value) and int(value) >= 1:
        return int(value), "epochs"
    match = _EVERY.match(value) if isinstance(value, str) else None
    if match is None or int(match.group(1)) < 1:
        raise ConfigError(f"checkpoint_every must be a number of epochs >= 1 or 'N steps', got {value!r}")
    return int(match.group(1)), "steps" if match.group(2).startswith("step") else "epochs"


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}")
    return value


@dataclass
class EstimatorConfig:
    """The validated parameters of one ``fit`` (both faces; see each field's doc, :func:`param_docs`).

    Construction checks every field that can be checked without the data or the
    framework; the framework's codec checks the model, optimizer and loss, and the core
    checks columns and shapes against the DataFrame.

    Raises:
        ConfigError: a field has a bad value; the message names the field.
    """

    num_proc: int | Sequence[int] | None = param(
        None, "number of training processes (ranks), or (min, max): as many as the cluster has slots for within "
        "the bounds, at start and at each relaunch; default: the engine's parallelism")
    min_num_proc: int | None = param(None, "the fewest ranks a fit starts or is relaunched with (num_proc is the "
                                     "most); num_proc=(min, max) sets both")
    max_failures: int = param(0, "relaunch training up to this many times after a lost rank, executor or Dask "
                              "worker, from the last checkpoint (an error in the model or data is not retried)")
    checkpoint_every: int | str = param(1, "rank 0 checkpoints to the store every N epochs (an int), or every N "
                                        "training steps ('N steps'); a relaunch or resume continues from the last "
                                        "checkpoint")
    backend: Any = param(None, "where the ranks run: a launcher's name ('local', 'spark', 'dask', 'ray'), a "
                         "hora.runners Launcher (e.g. RayLauncher(gpus_per_rank=1)), "
                         "hora.spark.common.backend.SparkBackend(num_proc=...) as in Horovod, or any object with "
                         "Horovod's run()/num_processes(); default: the engine of the DataFrame", NONE)
    store: Any = param(None, "hora.store.Store (or a URL) where data is materialized and runs are kept", PICKLE)
    model: Any = param(None, "the model to train", PICKLE)
    optimizer: Any = param(None, "an optimizer bound to the model's parameters, or a factory params -> optimizer", PICKLE)
    loss: Any = param(None, "loss callable (output, label) -> scalar, or a list with one per label", PICKLE)
    loss_weights: Sequence[float] | None = param(None, "weights of the per-label losses (one float per label)")
    metrics: Any = param(None, "metrics: callables (output, label) -> value or the framework's metric objects; a list "
                         "or a {name: metric} dict", PICKLE)
    feature_cols: Sequence[Any] | None = param(None, "one entry per model input: a column, or a list of scalar columns "
                                               "stacked into one input (a feature group)")
    label_cols: Sequence[str] | None = param(None, "label column names; one model output per label")
    sample_weight_col: str | None = param(None, "column of per-row loss weights")
    label_nan: Literal["error", "drop", "keep"] = param(
        "error", "a NaN or null label: 'error' (default) fails before training, naming the column and the count; "
        "'drop' drops those rows (counted in the log); 'keep' keeps NaN (a null still fails)")
    validation: float | str | None = param(None, "fraction of rows held out for validation, or a boolean column's name")
    batch_size: int = param(32, "rows per training batch on each rank")
    val_batch_size: int | None = param(None, "rows per validation batch (default: batch_size)")
    epochs: int = param(1, "number of passes over the training data")
    train_steps_per_epoch: int | None = param(None, "training batches per epoch (default: one pass over each rank's share)")
    validation_steps_per_epoch: int | None = param(None, "validation batches per epoch (default: all)")
    shuffle: bool = param(True, "shuffle the training data every epoch")
    shuffle_buffer_size: int | None = param(None, "rows mixed in memory by the reader's shuffle")
    random_seed: int | None = param(None, "seed of model init on the workers, the validation split and the shuffles")
    run_id: str | None = param(None, "name of the run in the store; fitting with an existing run_id resumes from its "
                               "last checkpoint")
    callbacks: Sequence[Any] | None = param(None, "hora.estimators.callbacks.Callback objects (and the framework's own "
                                            "callbacks where it has them)", PICKLE)
    gradient_compression: Any = param(None, "gradient compression for allreduce (e.g. hora.native.compression.fp16)",
                                      PICKLE)
    backward_passes_per_step: int = param(1, "gradient accumulation: backward passes per optimizer step")
    transformation_fn: Callable | None = param(None, "function applied to every batch (dict of numpy arrays -> dict) "
                                               "on the workers", PICKLE)
    decode_fn: Any = param(None, "decoding of binary feature columns on the ranks, in the reader's background thread: "
                           "{column: fn(bytes) -> array}; default hora.store.decode_image (Pillow: an (H, W, C) "
                           "uint8 array) for every binary feature column; {column: None} keeps the bytes", PICKLE)
    on_decode_error: Literal["raise", "skip"] = param(
        "raise", "a row whose decode_fn fails: 'raise' (default) fails the fit, naming the column and the row's "
        "place in its partition's file; 'skip' drops the row (counted and logged)")
    max_length: int | dict[str, int] | None = param(
        None, "variable-length array columns: each batch is padded to its longest row, at most this many values "
        "(an int, or {column: int}); longer rows are truncated (counted and logged) unless truncation=False")
    truncation: bool = param(True, "cut rows longer than max_length (False: such a row fails the fit, naming the "
                             "column and its length)")
    sparse_format: Literal["csr", "dense"] = param(
        "csr", "sparse vector columns (compress_sparse_cols=True) reach a PyTorch model as a torch.sparse_csr "
        "tensor per batch ('csr') or densified per batch ('dense')")
    collate_fn: Callable | None = param(None, "function on each numpy batch on the ranks (images decoded, "
                                        "variable-length rows as object arrays of arrays, strings as object arrays) "
                                        "-> dict of arrays; replaces hora's padding and sparse batching", PICKLE)
    input_shapes: Sequence[Sequence[int]] | None = param(None, "shape of each feature input including the batch "
                                                         "dimension, e.g. [[-1, 1, 8, 8]]")
    use_gpu: bool = param(False, "train on the GPU of each worker (one GPU per rank)")
    task_cpus: int | None = param(None, "CPUs per training task of Spark's training stage (its ResourceProfile; "
                                  "default: spark.task.cpus); Spark only")
    verbose: int = param(1, "0: quiet, 1: progress bar and epoch logs, 2: also batch logs")
    backend_env: dict[str, str] | None = param(None, "extra environment variables for the training workers")
    lr_scaling: str = param("linear", "'linear' (default): multiply the learning rate by num_proc, as Horovod does; "
                            "'none'")
    learning_rate: float | None = param(None, "learning rate overriding the optimizer's (before scaling); for "
                                        "parameter searches")
    output_cols: Sequence[str] | None = param(None, "prediction column names (default 'prediction' for one label, "
                                              "'<label>__output' for several)")
    task: Literal["classification", "regression"] | None = param(
        None, "'classification' (the model gives one logit per class, or one for two classes; the fitted model "
        "outputs rawPrediction, probability and a class index as prediction), 'regression' (outputs as they are), "
        "or None: inferred from the loss (cross-entropy / NLL / BCE: classification), logged once")
    prediction_col: str = param("prediction", "a classifier's class index column (double), MLlib's predictionCol")
    probability_col: str = param("probability", "a classifier's class probabilities column (an ML vector), MLlib's "
                                 "probabilityCol")
    raw_prediction_col: str = param("rawPrediction", "a classifier's logits column (an ML vector), MLlib's "
                                    "rawPredictionCol")
    start_timeout: float | None = param(None, "seconds to wait for every worker to start")
    partitions_per_process: int | None = param(None, "Parquet files of the materialized data per training process "
                                               "(default: one)")
    inmemory_cache_all: bool = param(False, "keep each rank's share of the data in memory after the first epoch "
                                     "instead of reading it again")
    train_reader_num_workers: int | None = param(None, "ignored (Horovod's petastorm knob)",
                                                 ignored=_IGNORED + "each rank reads in one background thread")
    val_reader_num_workers: int | None = param(None, "ignored (Horovod's petastorm knob)",
                                               ignored=_IGNORED + "each rank reads in one background thread")
    reader_pool_type: str | None = param(None, "where a rank reads and decodes its row groups: 'thread' (default: "
                                         "one background thread; Parquet decoding runs outside the GIL) or "
                                         "'process' (a pool of 2 worker processes per rank)")
    mp_start_method: str | None = param(None, "how reader_pool_type='process' starts its processes: 'spawn' "
                                        "(default), 'forkserver' or 'fork'")
    compress_sparse_cols: bool | None = param(None, "store Spark ML vector columns sparse (int32 indices + values "
                                              "per row: the store's size follows the non-zeros); default: dense")
    transformation_edit_fields: Any = param(None, "ignored (Horovod's petastorm knob)",
                                            ignored=_IGNORED + "it learns the transformed batch's fields from "
                                            "transformation_fn's output")
    transformation_removed_fields: Any = param(None, "ignored (Horovod's petastorm knob)",
                                               ignored=_IGNORED + "it learns the transformed batch's fields from "
                                               "transformation_fn's output")

    #: the feature inputs (columns and feature groups) of ``feature_cols``, parsed once when the config is
    #: made (not a parameter: ``dataclasses.replace`` parses again, a copy or a pickle carries it along)
    features: Features = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_common()
        self._check_training()
        self._check_ignored()

    # validation -------------------------------------------------------------------------
    def _check_common(self) -> None:
        from hora.store import Store

        if isinstance(self.num_proc, (tuple, list)):
            if len(self.num_proc) != 2:
                raise ConfigError(f"num_proc must be an int or (min, max), got {self.num_proc!r}")
            if self.min_num_proc is not None:
                raise ConfigError("give min_num_proc or num_proc=(min, max), not both")
            self.min_num_proc, self.num_proc = self.num_proc
        self.num_proc = _positive_int("num_proc", self.num_proc)
        self.min_num_proc = _positive_int("min_num_proc", self.min_num_proc)
        if self.min_num_proc is not None and self.num_proc is not None and self.min_num_proc > self.num_proc:
            raise ConfigError(f"num_proc bounds: min {self.min_num_proc} is greater than max {self.num_proc}")
        self.max_failures = _positive_int("max_failures", self.max_failures, allow_none=False, minimum=0)
        from hora.store.materialize import LABEL_NAN_MODES

        if self.label_nan not in LABEL_NAN_MODES:
            raise ConfigError(f"label_nan must be one of {', '.join(map(repr, LABEL_NAN_MODES))}, got {self.label_nan!r}")
        checkpoint_interval(self.checkpoint_every)
        check_backend(self.backend, num_proc=self.num_proc, max_failures=self.max_failures)
        if self.store is None:
            raise ConfigError("store is required: pass store=hora.store.Store.create(url) (or a store URL)")
        if isinstance(self.store, str):
            self.store = Store.create(self.store)
        elif not isinstance(self.store, Store):
            raise ConfigError(f"store must be a hora.store.Store or a URL string, got {type(self.store).__name__}")
        if self.model is None:
            raise ConfigError("model is required")
        if self.optimizer is None and self.needs_optimizer():
            raise ConfigError("optimizer is required: an optimizer bound to the model's parameters, or a factory")
        if self.loss is None and self.needs_loss():
            raise ConfigError("loss is required: a callable (output, label) -> scalar, or one per label")
        self.features = Features.parse(self.feature_cols)  # parsed once: every reader takes this field
        self.feature_cols = self.features.as_config()
        labels = _str_list("label_cols", self.label_cols)
        if self.task == "causal_lm":
            if not self.supports_task("causal_lm"):
                raise ConfigError(f"task='causal_lm' is for TorchEstimator (a Hugging Face causal language model "
                                  f"with tokenizer=); {type(self).__name__} does not take it")
            if labels:
                raise ConfigError(f"task='causal_lm' takes no label column (the labels are the input ids, shifted by "
                                  f"the model): drop label_cols={labels}")
            labels = []
        elif labels is None:
            raise ConfigError("label_cols is required: the names of the label columns")
        self.label_cols = labels
        overlap = set(self.features.columns) & set(self.label_cols)
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
        elif self.loss is not None and not callable(self.loss):
            raise ConfigError(f"loss must be callable or a list of callables, got {self.loss!r}")
        if self.loss_weights is not None:
            try:
                weights = [float(w) for w in self.loss_weights]
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"loss_weights must be a list of numbers, got {self.loss_weights!r}") from exc
            if len(weights) != n_labels:
                raise ConfigError(f"loss_weights has {len(weights)} entries but there are {n_labels} label_cols")
            self.loss_weights = weights
        if self.output_cols is not None:
            outs = _str_list("output_cols", self.output_cols)
            if self.task == "causal_lm":
                if len(outs) not in (1, 2) or len(set(outs)) != len(outs):
                    raise ConfigError(f"task='causal_lm' takes output_cols of one or two names (the per-row loss "
                                      f"column, then the generated text column), got {outs}")
            elif len(outs) != n_labels:
                raise ConfigError(f"output_cols has {len(outs)} names but there are {n_labels} label_cols")
            self.output_cols = outs
        if self.task not in TASKS:
            raise ConfigError(f"task must be one of {', '.join(map(repr, TASKS))}, got {self.task!r}")
        for name in CLASSIFIER_COLS:
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"{name} must be a column name, got {getattr(self, name)!r}")
        names = [getattr(self, name) for name in CLASSIFIER_COLS]
        if len(set(names)) != len(names):
            raise ConfigError(f"prediction_col, probability_col and raw_prediction_col must differ, got {names}")
        if self.task == "classification" and n_labels != 1:
            raise ConfigError(f"task='classification' takes one label column, got label_cols {self.label_cols}")
        if self.run_id is not None:
            from hora.runners.spec import check_run_id  # the one run id rule (store folders, task keys)

            check_run_id(self.run_id)

    def _check_training(self) -> None:
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
        _flag("shuffle", self.shuffle)
        self.shuffle_buffer_size = _positive_int("shuffle_buffer_size", self.shuffle_buffer_size)
        if self.random_seed is not None and not _is_int(self.random_seed):
            raise ConfigError(f"random_seed must be an integer, got {self.random_seed!r}")
        cbs = list(self.callbacks or [])
        for cb in cbs:
            if not self.accepts_callback(cb):
                raise ConfigError(f"callbacks must be {self.callback_kinds()}, got {cb!r}")
        self.callbacks = cbs
        self.backward_passes_per_step = _positive_int("backward_passes_per_step", self.backward_passes_per_step, False)
        if self.transformation_fn is not None and not callable(self.transformation_fn):
            raise ConfigError(f"transformation_fn must be callable, got {self.transformation_fn!r}")
        self._check_columns_ops()
        if self.input_shapes is not None:
            shapes = []
            for shape in self.input_shapes:
                try:
                    shapes.append([int(d) for d in shape])
                except (TypeError, ValueError) as exc:
                    raise ConfigError(f"input_shapes must be a list of shapes (lists of ints), got {self.input_shapes!r}") from exc
            n = len(self.feature_cols)
            if len(shapes) != n:
                raise ConfigError(f"input_shapes has {len(shapes)} shapes but there are {n} feature_cols {self.feature_cols}")
            self.input_shapes = shapes
        _flag("use_gpu", self.use_gpu)
        self.task_cpus = _positive_int("task_cpus", self.task_cpus)
        if not _is_int(self.verbose) or self.verbose < 0:
            raise ConfigError(f"verbose must be an integer >= 0, got {self.verbose!r}")
        if self.backend_env is not None and (not isinstance(self.backend_env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.backend_env.items())):
            raise ConfigError(f"backend_env must be a dict of str -> str, got {self.backend_env!r}")
        if self.lr_scaling not in LR_SCALING_POLICIES:
            raise ConfigError(f"lr_scaling must be one of {LR_SCALING_POLICIES}, got {self.lr_scaling!r}")
        self.learning_rate = _positive_number("learning_rate", self.learning_rate)
        self.start_timeout = _positive_number("start_timeout", self.start_timeout)
        self.partitions_per_process = _positive_int("partitions_per_process", self.partitions_per_process)
        _flag("inmemory_cache_all", self.inmemory_cache_all)
        if self.reader_pool_type not in (None, "thread", "process"):
            raise ConfigError(f"reader_pool_type must be 'thread' or 'process', got {self.reader_pool_type!r}")
        if self.mp_start_method not in (None, "spawn", "forkserver", "fork"):
            raise ConfigError(f"mp_start_method must be 'spawn', 'forkserver' or 'fork' (how reader_pool_type="
                              f"'process' starts its processes), got {self.mp_start_method!r}")

    def _check_columns_ops(self) -> None:
        """decode_fn, on_decode_error, max_length, truncation, sparse_format, collate_fn, compress_sparse_cols."""
        if self.decode_fn is not None:
            if callable(self.decode_fn) or not isinstance(self.decode_fn, dict):
                raise ConfigError(f"decode_fn must map binary column names to functions bytes -> array, e.g. "
                                  f"{{'image': hora.store.decode_image}}, got {self.decode_fn!r}")
            for col, fn in self.decode_fn.items():
                if col not in self.features.columns:
                    raise ConfigError(f"decode_fn names column {col!r}, which is not in feature_cols "
                                      f"{self.features.columns}")
                if fn is not None and not callable(fn):
                    raise ConfigError(f"decode_fn[{col!r}] must be callable (or None to keep the bytes), got {fn!r}")
        if self.on_decode_error not in ("raise", "skip"):
            raise ConfigError(f"on_decode_error must be 'raise' or 'skip', got {self.on_decode_error!r}")
        limits = self.max_length if isinstance(self.max_length, dict) else (
            {} if self.max_length is None else {"": self.max_length})
        for col, n in limits.items():
            if not _is_int(n) or n < 1:
                raise ConfigError(f"max_length{f'[{col!r}]' if col else ''} must be an int >= 1, got {n!r}")
        _flag("truncation", self.truncation)
        if self.sparse_format not in ("csr", "dense"):
            raise ConfigError(f"sparse_format must be 'csr' or 'dense', got {self.sparse_format!r}")
        if self.collate_fn is not None and not callable(self.collate_fn):
            raise ConfigError(f"collate_fn must be callable, got {self.collate_fn!r}")
        if self.compress_sparse_cols is not None and not isinstance(self.compress_sparse_cols, bool):
            raise ConfigError(f"compress_sparse_cols must be True or False, got {self.compress_sparse_cols!r}")

    def _check_ignored(self) -> None:
        for f in param_fields(type(self)):
            info = f.metadata["hora"]
            if info.ignored and getattr(self, f.name) is not None and f.name not in _warned:
                _warned.add(f.name)
                logger.warning("%s=%r is %s", f.name, getattr(self, f.name), info.ignored)

    # hooks of framework subclasses --------------------------------------------------------
    def needs_optimizer(self) -> bool:
        """Whether ``optimizer`` is required (Lightning's modules configure their own)."""
        return True

    def needs_loss(self) -> bool:
        """Whether ``loss`` is required."""
        return True

    @classmethod
    def accepts_callback(cls, cb: Any) -> bool:
        """Whether ``cb`` may be in ``callbacks`` (hora's callbacks; frameworks add their own kinds)."""
        from hora.estimators.callbacks import Callback

        return isinstance(cb, Callback)

    @classmethod
    def callback_kinds(cls) -> str:
        """What :meth:`accepts_callback` takes, for messages."""
        return "hora.estimators.callbacks.Callback instances"

    # derived ------------------------------------------------------------------------------
    @property
    def seed(self) -> int:
        """``random_seed`` or 0."""
        return self.random_seed if self.random_seed is not None else 0

    @property
    def val_batch(self) -> int:
        """``val_batch_size`` or ``batch_size``."""
        return self.val_batch_size or self.batch_size

    def json_values(self) -> dict[str, Any]:
        """``{name: value}`` of the JSON parameters (what MLflow logs as params)."""
        return {name: getattr(self, name) for name in sorted(json_params(type(self)))}

    def supports_task(self, task: str) -> bool:
        """Whether this framework's estimator takes ``task`` (``"causal_lm"``: TorchEstimator only)."""
        return task != "causal_lm"

    def for_workers(self, **resolved: Any) -> "EstimatorConfig":
        """A copy for the training spec: the JSON parameters (and ``resolved`` values) only.

        The pickled parameters (model, optimizer, callbacks, ...) travel frozen in the
        spec's payload instead, and the unsaved ones (``backend``) stay on the driver.
        """
        clone = copy.copy(self)
        keep = json_params(type(self))
        for f in param_fields(type(self)):
            if f.name not in keep:
                setattr(clone, f.name, None)
        for name, value in resolved.items():
            setattr(clone, name, value)
        return clone

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "EstimatorConfig":
        """Build from a ``{name: value}`` dict.

        Raises:
            ParamError: an unknown name (Horovod's names say what to use instead).
        """
        params = mllib_aliases(params)
        check_param_names(cls, params, "estimator")
        return cls(**params)


def mllib_aliases(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with MLlib's column keywords (``predictionCol``, ``probabilityCol``, ``rawPredictionCol``)
    under hora's names.

    Raises:
        ConfigError: both names of one parameter are given.
    """
    out = dict(params)
    for alias, name in MLLIB_ALIASES.items():
        if alias in out:
            if name in out:
                raise ConfigError(f"give {name} or MLlib's {alias}, not both")
            out[name] = out.pop(alias)
    return out


def check_param_names(cls: type, names: Any, owner: str) -> None:
    """Every name in ``names`` is a parameter of the config class ``cls``.

    Raises:
        ParamError: names the unknown parameters; for Horovod's keywords hora does not
            take, what to use instead.
    """
    known = set(param_defaults(cls))
    unknown = sorted(set(names) - known)
    if not unknown:
        return
    horovod = [f"{n!r}: {HOROVOD_UNSUPPORTED[n]}" for n in unknown if n in HOROVOD_UNSUPPORTED]
    others = [n for n in unknown if n not in HOROVOD_UNSUPPORTED]
    parts = []
    if horovod:
        parts.append("Horovod parameter(s) hora does not take: " + "; ".join(horovod))
    for name in others:
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"see help({owner.split('(')[0]}) for its parameters"
        parts.append(f"it has no parameter {name!r} (an unknown estimator parameter): {hint}")
    raise ParamError(f"{owner}: " + ". ".join(parts))


def default_output_cols(label_cols: Sequence[str], output_cols: Sequence[str] | None = None) -> list[str]:
    """``output_cols`` if given, else ``["prediction"]`` for one label and ``["<label>__output", ...]`` for several."""
    if output_cols:
        return list(output_cols)
    if len(label_cols) == 1:
        return ["prediction"]
    return [f"{c}__output" for c in label_cols]


#: The shared parameters' defaults and docs, and the JSON set (derived from the fields above).
PARAM_DEFAULTS: dict[str, Any] = param_defaults(EstimatorConfig)
PARAM_DOCS: dict[str, str] = param_docs(EstimatorConfig)
JSON_PARAMS: frozenset[str] = json_params(EstimatorConfig)

__all__ = ["EstimatorConfig", "ParamInfo", "ParamError", "param", "param_fields", "param_defaults", "param_docs",
           "param_types", "param_signature", "json_params", "unsaved_params", "check_param_names",
           "HOROVOD_UNSUPPORTED", "PARAM_DEFAULTS",
           "PARAM_DOCS", "JSON_PARAMS", "LR_SCALING_POLICIES", "LAUNCHER_NAMES", "default_output_cols", "TASKS",
           "CLASSIFIER_COLS", "MLLIB_ALIASES", "mllib_aliases"]
