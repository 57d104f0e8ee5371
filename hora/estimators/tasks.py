"""Classification as MLlib and scikit-learn expect it: the task, a classifier's outputs, its labels.

``task=None`` (the default) is inferred once on the driver, from the loss (logged at INFO):

* PyTorch: ``CrossEntropyLoss``, ``NLLLoss``, ``BCEWithLogitsLoss``, ``BCELoss`` (or
  subclasses) -> classification; anything else -> regression;
* Keras: ``sparse_categorical_crossentropy``, ``categorical_crossentropy``,
  ``binary_crossentropy`` (names, functions or loss objects) -> classification;
* Lightning: the module's ``task`` attribute when it is ``"classification"`` or
  ``"regression"`` (the module computes its own loss), else regression.

Inference needs one label column; with several, the task stays regression (outputs as
they are) unless ``task="classification"`` is given, which takes one label.

A classifier's model output is one score per class, ``(n, classes)``, or one score for two
classes, ``(n,)`` / ``(n, 1)``. The scores are logits (``CrossEntropyLoss``,
``BCEWithLogitsLoss``, a Keras loss with ``from_logits=True``, a LightningModule),
log-probabilities (``NLLLoss``: the softmax of log-probabilities is the probabilities) or
probabilities (``BCELoss``; a Keras loss with ``from_logits=False``). :class:`ClassifierHead`
turns them into MLlib's three columns: ``rawPrediction`` (the scores; for one score ``z``,
``[-z, z]`` as MLlib's binary ``LogisticRegression`` writes its margin, with ``z`` the logit
of a probability output), ``probability`` (softmax; for one score ``[1 - p, p]``) and
``prediction`` (the class index, a double).

Labels of a classifier are checked on the driver after materialization, before any worker
starts: integers in ``[0, classes)`` (:func:`check_labels`).

``task="causal_lm"`` (TorchEstimator, a Hugging Face causal language model with ``tokenizer=``) has
no label column: the labels are the input ids. Its :class:`CausalLMHead` is kept with the fitted
model, and :class:`CausalLMCodec` writes each row's mean token loss (and, with ``generate_kwargs``,
the row's continuation decoded by the tokenizer) instead of the model's logits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from hora.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

CLASSIFICATION, REGRESSION, CAUSAL_LM = "classification", "regression", "causal_lm"
LOGITS, PROBABILITIES = "logits", "probabilities"

_TORCH_LOSSES = {"CrossEntropyLoss": LOGITS, "NLLLoss": LOGITS, "BCEWithLogitsLoss": LOGITS, "BCELoss": PROBABILITIES}
_KERAS_LOSSES = ("sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy")


@dataclass(frozen=True)
class ClassifierHead:
    """How a classifier's model output becomes MLlib's columns.

    Attributes:
        classes: the number of classes (2 for a single score).
        scores: ``"logits"`` (or log-probabilities) or ``"probabilities"``: what the model outputs.
        single: the model gives one score per row (binary), not one per class.
        seen: the label values seen in training, sorted (scikit-learn's ``classes_``).
    """

    classes: int
    scores: str = LOGITS
    single: bool = False
    seen: tuple = ()
    task = CLASSIFICATION

    def columns(self, out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(rawPrediction (n, classes), probability (n, classes), prediction (n,))`` of a model output."""
        out = np.asarray(out, dtype=np.float64)
        n = out.shape[0]
        if self.single:
            z = out.reshape(n)
            if self.scores == PROBABILITIES:
                p = np.clip(z, 0.0, 1.0)
                with np.errstate(divide="ignore"):
                    z = np.log(p) - np.log1p(-p)
            else:
                p = _sigmoid(z)
            raw = np.stack([-z, z], axis=1)
            prob = np.stack([1.0 - p, p], axis=1)
        else:
            raw = out.reshape(n, -1)
            if self.scores == PROBABILITIES:
                total = raw.sum(axis=1, keepdims=True)
                prob = raw / np.where(total > 0, total, 1.0)
            else:
                shifted = raw - raw.max(axis=1, keepdims=True)
                e = np.exp(shifted)
                prob = e / e.sum(axis=1, keepdims=True)
        return raw, prob, prob.argmax(axis=1).astype(np.float64)

    def to_meta(self) -> dict[str, Any]:
        """The JSON form saved with a fitted model."""
        return {"classes": self.classes, "scores": self.scores, "single": self.single, "seen": list(self.seen)}

    @classmethod
    def from_meta(cls, meta: dict[str, Any] | None) -> "ClassifierHead | CausalLMHead | None":
        """Inverse of :meth:`to_meta` (None for a regressor; a :class:`CausalLMHead` for a causal LM's)."""
        if not meta:
            return None
        if meta.get("task") == CAUSAL_LM:
            return CausalLMHead.from_meta(meta)
        return cls(classes=int(meta["classes"]), scores=str(meta.get("scores", LOGITS)), single=bool(meta.get("single")),
                   seen=tuple(meta.get("seen", ())))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    out = np.empty_like(z)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    ez = np.exp(z[~pos])
    out[~pos] = ez / (1.0 + ez)
    return out


def loss_task(framework: str, loss: Any, model: Any = None) -> tuple[str | None, str]:
    """``(task or None, scores)`` the loss (or for Lightning the module) says, for :func:`resolve_task`."""
    if framework == "lightning":
        declared = getattr(model, "task", None)
        return (declared if declared in (CLASSIFICATION, REGRESSION) else None), LOGITS
    if isinstance(loss, (list, tuple)):
        loss = loss[0] if len(loss) == 1 else None
    if loss is None:
        return None, LOGITS
    if framework == "keras":
        name = loss if isinstance(loss, str) else getattr(loss, "name", None) or getattr(loss, "__name__", None) or ""
        if name not in _KERAS_LOSSES:
            name = _snake(type(loss).__name__)
        if name in _KERAS_LOSSES:
            config = loss.get_config() if callable(getattr(loss, "get_config", None)) else {}
            from_logits = bool(getattr(loss, "from_logits", False) or (config or {}).get("from_logits", False))
            return CLASSIFICATION, LOGITS if from_logits else PROBABILITIES
        return None, LOGITS
    for cls in type(loss).__mro__:
        if cls.__module__.startswith("torch.nn") and cls.__name__ in _TORCH_LOSSES:
            return CLASSIFICATION, _TORCH_LOSSES[cls.__name__]
    return None, LOGITS


def _snake(name: str) -> str:
    out = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
    return out.replace("cross_entropy", "crossentropy")


def resolve_task(config: Any, framework: str, output_shapes: Sequence[Sequence[int]],
                 label_shape: Sequence[int] = ()) -> "ClassifierHead | CausalLMHead | None":
    """The fit's :class:`ClassifierHead` (None: regression), from ``config.task`` or inferred (logged once);
    ``task="causal_lm"``: its :class:`CausalLMHead`.

    ``label_shape`` is the label column's per-row shape: a classification loss over one-hot or
    probability vectors (Keras' ``categorical_crossentropy`` on a one-hot column) is not inferred
    to be a classifier (MLlib's classifiers and evaluators take class indices): its outputs stay as
    the model gives them.

    Raises:
        ConfigError: ``task="classification"`` with a model output that is not one score per
            class (or one score for two classes).
    """
    inferred, scores = loss_task(framework, getattr(config, "loss", None), getattr(config, "model", None))
    task = config.task
    if task == CAUSAL_LM:
        return CausalLMHead(generate_kwargs=dict(getattr(config, "generate_kwargs", None) or {}) or None)
    if task is None:
        if inferred == CLASSIFICATION and len(config.label_cols) != 1:
            logger.info("task: the loss is a classification loss but there are %d label columns; outputs stay as "
                        "the model gives them (task='classification' takes one label)", len(config.label_cols))
            return None
        if inferred == CLASSIFICATION and tuple(label_shape) not in ((), (1,)):
            logger.info("task: the loss is a classification loss but label %r holds vectors of shape %s (one-hot?); "
                        "outputs stay as the model gives them (task='classification' takes class indices)",
                        config.label_cols[0], tuple(label_shape))
            return None
        task = inferred or REGRESSION
        logger.info("task=%r inferred from the %s (pass task= to choose)", task,
                    "module's task attribute" if framework == "lightning" else f"loss {type(config.loss).__name__}")
    if task != CLASSIFICATION:
        return None
    shape = tuple(int(d) for d in output_shapes[0])
    if shape in ((), (1,)):
        return ClassifierHead(classes=2, scores=scores, single=True)
    if len(shape) == 1 and shape[0] > 1:
        return ClassifierHead(classes=shape[0], scores=scores)
    raise ConfigError(f"task='classification' needs a model output of one score per class (n, classes) or one score "
                      f"(n,) / (n, 1) for two classes; the model's output for label {config.label_cols[0]!r} has "
                      f"per-row shape {shape}")


def sample_for_check(config: Any, framework: str, sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``sample`` for the codec's check on the driver: a classifier's (1-D, numeric) labels are replaced
    by class 0 there, so that the check learns the model's output shape whatever the labels hold, and
    the data's labels that are not class indices are reported by :func:`check_labels` (with their
    count) instead of as a loss or shape error."""
    task = config.task
    if task is None and len(config.label_cols) == 1:
        task = loss_task(framework, getattr(config, "loss", None), getattr(config, "model", None))[0]
    if task != CLASSIFICATION:
        return sample
    name = config.label_cols[0]
    values = sample.get(name)
    if task != CLASSIFICATION or values is None or values.dtype.kind not in "fiu" or values.ndim != 1:
        return sample
    return {**sample, name: np.zeros_like(values)}  # class 0: a valid index for any number of classes


#: bad labels listed in a DataError at most
_SHOWN = 3


def check_labels(store: Any, info: Any, label_col: str, classes: int) -> tuple[int, ...]:
    """The stored labels of a classifier are integers in ``[0, classes)`` (read from the materialized
    files' label column only, on the driver, before any worker starts); returns the values seen, sorted.

    Raises:
        DataError: names the column, bad values and how many rows hold one.
    """
    import pyarrow.parquet as pq

    bad_rows, examples, rows, seen = 0, [], 0, set()
    for split in ("train", "val"):
        for path in info.file_paths(split):
            if store.is_local:
                table = pq.read_table(path, columns=[label_col])
            else:
                with store.open(path, "rb") as fh:
                    table = pq.read_table(fh, columns=[label_col])
            values = table.column(label_col).to_numpy(zero_copy_only=False)
            if values.dtype == object:  # lists (one-hot or array labels): not class ids
                raise DataError(f"label column {label_col!r} of a classifier holds arrays; it needs one class index "
                                f"per row in [0, {classes})")
            values = values.astype(np.float64, copy=False)
            rows += len(values)
            bad = ~((values == np.floor(values)) & (values >= 0) & (values < classes))
            count = int(bad.sum())
            seen.update(np.unique(values[~bad]).tolist())
            if count:
                bad_rows += count
                for v in np.unique(values[bad])[:_SHOWN]:
                    if len(examples) < _SHOWN and v not in examples:
                        examples.append(float(v))
    if bad_rows:
        shown = ", ".join(repr(int(v)) if float(v).is_integer() else repr(v) for v in examples)
        raise DataError(f"label column {label_col!r}: {bad_rows} of {rows} rows hold a value that is not a class index "
                        f"in [0, {classes}) (e.g. {shown}); a classifier with {classes} output(s) needs integer labels "
                        "0..classes-1 (index strings with StringIndexer)")
    missing = classes - len(seen)
    if missing:
        logger.warning("label column %r: %d of the model's %d classes never occur in the training data", label_col,
                       missing, classes)
    return tuple(int(v) for v in sorted(seen))


@dataclass(frozen=True)
class ClassifierCodec:
    """A codec whose ``predict`` returns a classifier's three outputs (raw scores, probabilities,
    class index) instead of the model's one; everything else is the wrapped codec's."""

    codec: Any
    head: ClassifierHead

    @property
    def name(self) -> str:
        return self.codec.name

    def deserialize(self, files: dict[str, bytes]) -> Any:
        return self.codec.deserialize(files)

    def predict(self, model: Any, inputs: Sequence[np.ndarray], input_shapes: Any, batch_size: int,
                **kwargs: Any) -> list[np.ndarray]:
        outs = self.codec.predict(model, inputs, input_shapes, batch_size, **kwargs)
        return list(self.head.columns(outs[0])) if outs else []

    def output_shapes(self) -> list[tuple[int, ...]]:
        """Per-row shapes of the three outputs."""
        return [(self.head.classes,), (self.head.classes,), ()]


#: output column names of a causal LM's transform: the per-row mean token loss, the generated text
CAUSAL_LM_COLS = ("loss", "generated")
#: the per-row shape that marks a string output column (a causal LM's generated text)
TEXT_SHAPE = ("text",)


@dataclass(frozen=True)
class CausalLMHead:
    """A causal language model's outputs in ``transform``: its per-row mean token loss and, with
    ``generate_kwargs``, its generated continuation (decoded text).

    Attributes:
        generate_kwargs: keyword arguments of the model's ``generate()``; None: no generated column.
    """

    generate_kwargs: dict | None = None
    task = CAUSAL_LM
    classes = 0

    def output_cols(self, output_cols: Sequence[str] | None = None) -> list[str]:
        """The transform's columns: ``output_cols`` (one or two names) or ``loss`` (and ``generated``)."""
        names = list(output_cols or ()) + list(CAUSAL_LM_COLS[len(output_cols or ()):])
        return names[:2 if self.generate_kwargs is not None else 1]

    def output_shapes(self) -> list[tuple]:
        """Per-row shapes: the loss a scalar, the generated text :data:`TEXT_SHAPE`."""
        return [()] + ([TEXT_SHAPE] if self.generate_kwargs is not None else [])

    def to_meta(self) -> dict[str, Any]:
        return {"task": CAUSAL_LM, "generate_kwargs": self.generate_kwargs}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> "CausalLMHead":
        return cls(generate_kwargs=meta.get("generate_kwargs"))


@dataclass(frozen=True)
class CausalLMCodec:
    """A codec whose ``predict`` returns a causal LM's per-row mean token loss (and generated text)
    instead of its logits; everything else is the wrapped codec's."""

    codec: Any
    head: CausalLMHead

    @property
    def name(self) -> str:
        return self.codec.name

    def deserialize(self, files: dict[str, bytes]) -> Any:
        return self.codec.deserialize(files)

    def predict(self, model: Any, inputs: Sequence[np.ndarray], input_shapes: Any, batch_size: int,
                device: Any = None, **kwargs: Any) -> list[np.ndarray]:
        return self.codec.causal_lm_outputs(model, inputs, input_shapes, batch_size, self.head.generate_kwargs,
                                            device=device)

    def output_shapes(self) -> list[tuple]:
        return self.head.output_shapes()


def head_codec(codec: Any, head: "ClassifierHead | CausalLMHead") -> Any:
    """The codec that writes ``head``'s outputs in ``transform``."""
    return CausalLMCodec(codec, head) if isinstance(head, CausalLMHead) else ClassifierCodec(codec, head)


__all__ = ["ClassifierHead", "ClassifierCodec", "CausalLMHead", "CausalLMCodec", "head_codec", "CAUSAL_LM",
           "CAUSAL_LM_COLS", "TEXT_SHAPE", "resolve_task", "loss_task", "check_labels", "sample_for_check", "CLASSIFICATION",
           "REGRESSION", "LOGITS", "PROBABILITIES"]
