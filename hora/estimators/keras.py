"""Keras 3 (TensorFlow backend) hooks for the engine-neutral fit pipeline, and ``KerasEstimator`` on both faces.

``hora.spark.KerasEstimator`` / ``hora.dask.KerasEstimator`` take the shared params of
:data:`hora.estimators.params.PARAM_DOCS` plus ``custom_objects``:

* ``model``: a ``keras.Model`` (functional, sequential or subclassed with
  ``get_config``); it travels to the workers in the ``.keras`` format.
* ``optimizer``: a Keras 3 optimizer instance (or its name, e.g. ``"adam"``); each
  worker rebuilds it from its config, scales its learning rate (``lr_scaling``) and
  wraps it in :func:`hora.keras.DistributedOptimizer`.
* ``loss``: a Keras loss object or function (or its name, e.g. ``"mse"``), or one per
  label; ``metrics``: what ``model.compile(metrics=...)`` accepts.
* ``custom_objects``: ``{name: class or function}`` needed to load the model (custom
  layers, losses) when they are not registered with
  ``keras.saving.register_keras_serializable``.

Conventions: the model is called with one input per feature column (a single tensor
for one column, a list for several), each reshaped to its ``input_shapes`` entry when
given; floating features are cast to float32; the model has one output per label
column. A label whose values per row match its output's (``(n,)`` vs ``(n, 1)``) is
reshaped to it; integer labels for an ``(n, classes)`` output stay as class ids
(``SparseCategoricalCrossentropy``).

Each worker trains with the shared loop (:mod:`hora.estimators.worker`), reading its
batches through the store reader's ``tf.data`` adapter
(:func:`hora.store.tf_adapter.make_tf_dataset`, see :meth:`KerasTrainer.batches`), one
compiled ``train_on_batch`` per batch of tensors; rank 0's checkpoints are the model (with its optimizer
state) in the ``.keras`` format, written to bytes through a temporary file, and so is
the fit's result and a saved model. ``transform`` runs batched ``predict_on_batch`` on
the executors / Dask workers.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

from hora.errors import ConfigError, DataError
from hora.estimators.params import PARAM_DEFAULTS, EstimatorConfig
from hora.estimators.spec import freeze, thaw
from hora.estimators.trainer import Trainer

logger = logging.getLogger(__name__)

MODEL_FILE = "model.keras"
CUSTOM_OBJECTS_FILE = "custom_objects.pkl"


# ---------------------------------------------------------------------------------------
# .keras bytes
# ---------------------------------------------------------------------------------------
def model_to_bytes(model: Any) -> bytes:
    """The model (architecture, weights, compile config and optimizer state) in the ``.keras`` format."""
    with tempfile.TemporaryDirectory(prefix="hora-keras-") as tmp:
        path = os.path.join(tmp, MODEL_FILE)
        model.save(path)
        with open(path, "rb") as fh:
            return fh.read()


def model_from_bytes(data: bytes, custom_objects: dict | None = None, compile: bool = True) -> Any:
    """Inverse of :func:`model_to_bytes`.

    With ``compile=True`` a model whose compile config cannot be restored (e.g. a loss
    that is neither registered nor in ``custom_objects``) is loaded uncompiled, with a
    warning.

    Raises:
        ConfigError: the model itself cannot be rebuilt (names the missing object).
    """
    import keras

    with tempfile.TemporaryDirectory(prefix="hora-keras-") as tmp:
        path = os.path.join(tmp, MODEL_FILE)
        with open(path, "wb") as fh:
            fh.write(data)
        try:
            return keras.models.load_model(path, custom_objects=custom_objects, compile=compile)
        except Exception as exc:
            if compile:
                try:
                    model = keras.models.load_model(path, custom_objects=custom_objects, compile=False)
                except Exception:
                    pass
                else:
                    logger.warning("loaded the Keras model without its compile config: %s", exc)
                    return model
            raise ConfigError(
                f"cannot rebuild the Keras model from the .keras format: {type(exc).__name__}: {exc}. "
                "Pass the custom layers/losses it uses in custom_objects, or register them with "
                "keras.saving.register_keras_serializable"
            ) from exc


def _set_custom_objects(model: Any, custom_objects: dict | None) -> None:
    # not a Keras-tracked attribute: a plain dict of classes on the instance
    object.__setattr__(model, "_hora_custom_objects", dict(custom_objects or {}))


def _get_custom_objects(model: Any) -> dict:
    return dict(getattr(model, "_hora_custom_objects", {}) or {})


# ---------------------------------------------------------------------------------------
# arrays in, arrays out
# ---------------------------------------------------------------------------------------
def _stack(arr: Any) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.dtype == object:
        arr = np.stack([np.asarray(v) for v in arr])
    return arr


def to_inputs(arrays: Sequence[np.ndarray], input_shapes: Any) -> Any:
    """Feature arrays -> what the model is called with (one array, or a list)."""
    out = []
    for i, arr in enumerate(arrays):
        arr = _stack(arr)
        if arr.dtype.kind == "f" and arr.dtype != np.float32:
            arr = arr.astype(np.float32)
        elif arr.dtype.kind == "b":
            arr = arr.astype(np.float32)
        if input_shapes is not None:
            shape = list(input_shapes[i])
            try:
                arr = arr.reshape(shape)
            except ValueError as exc:
                raise DataError(
                    f"feature {i} with batch shape {arr.shape} cannot be reshaped to input_shapes[{i}]={shape}: {exc}"
                ) from exc
        out.append(arr)
    return out[0] if len(out) == 1 else out


def _label_target(row: tuple, kind: str, out_shape: tuple, name: str) -> tuple | None:
    """How a label of per-row shape ``row`` (numpy dtype kind ``kind``) meets an output of
    per-row shape ``out_shape``: None (as it is) or the per-row shape to reshape it to.

    Raises:
        ConfigError: incompatible per-row shapes (names the label and both shapes).
    """
    if row == out_shape:
        return None
    if kind in "iu" and len(out_shape) >= 1 and out_shape[-1] > 1 and row == out_shape[:-1]:
        return None  # class ids for a (classes,) output
    if int(np.prod(row)) == int(np.prod(out_shape)):
        return out_shape
    raise ConfigError(
        f"label {name!r} has per-row shape {row} but the model's output for it has per-row shape {out_shape}"
    )


def align_label(label: np.ndarray, out_shape: Sequence[int], name: str) -> np.ndarray:
    """``label`` shaped for an output of per-row shape ``out_shape`` (see the module docstring).

    Raises:
        ConfigError: incompatible per-row shapes (names the label and both shapes).
    """
    label = _stack(label)
    target = _label_target(tuple(label.shape[1:]), label.dtype.kind, tuple(out_shape), name)
    return label if target is None else label.reshape((label.shape[0], *target))


def _outputs_list(out: Any) -> list:
    if isinstance(out, dict):
        return list(out.values())
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]


# ---------------------------------------------------------------------------------------
# the hooks
# ---------------------------------------------------------------------------------------
def _keras_loss(loss: Any) -> Any:
    import keras

    if isinstance(loss, (list, tuple)):
        return [_keras_loss(item) for item in loss]
    if isinstance(loss, str):
        try:
            return keras.losses.get(loss)
        except ValueError as exc:
            raise ConfigError(f"loss {loss!r} is not a Keras loss name: {exc}") from exc
    return loss


def _keras_optimizer(optimizer: Any) -> Any:
    import keras

    if isinstance(optimizer, str):
        try:
            return keras.optimizers.get(optimizer)
        except ValueError as exc:
            raise ConfigError(f"optimizer {optimizer!r} is not a Keras optimizer name: {exc}") from exc
    return optimizer


def keras_params(params: dict[str, Any]) -> dict[str, Any]:
    """The params with Keras names resolved: ``loss="mse"`` -> a loss function, ``optimizer="adam"`` -> an instance."""
    params = dict(params)
    if params.get("loss") is not None:
        params["loss"] = _keras_loss(params["loss"])
    if params.get("optimizer") is not None:
        params["optimizer"] = _keras_optimizer(params["optimizer"])
    return params


@dataclass
class KerasState:
    """Per-run state of one Keras worker (what :meth:`KerasTrainer.setup` returns)."""

    hvd: Any
    model: Any
    optimizer: Any
    feature_cols: tuple
    label_cols: tuple
    sample_weight_col: str | None
    input_shapes: Any
    output_shapes: list
    metric_keys: list = field(default_factory=list)
    custom_objects: dict = field(default_factory=dict)


class KerasTrainer(Trainer):
    """The Keras 3 implementation of the framework hooks (see :class:`~hora.estimators.trainer.Trainer`)."""

    name = "keras"

    # ---- driver ------------------------------------------------------------------------
    def check(self, config: Any, sample: dict[str, np.ndarray]) -> dict[str, Any]:
        import keras

        from hora.keras.optimizer import check_keras3_optimizer

        model = config.model
        if not isinstance(model, keras.Model):
            mod = type(model).__module__
            hint = " (a tf_keras / Keras 2 model: build it with `import keras`, Keras 3)" if mod.startswith(
                ("tf_keras", "tensorflow.python.keras")) else ""
            raise ConfigError(f"model must be a keras.Model, got {mod}.{type(model).__name__}{hint}")
        check_keras3_optimizer(_keras_optimizer(config.optimizer), "KerasEstimator: optimizer")
        n = len(next(iter(sample.values()))) if sample else 0
        if n == 0:
            raise DataError("cannot check the model on an empty DataFrame sample")
        inputs = to_inputs([sample[c] for c in config.feature_cols], config.input_shapes)
        try:
            outs = _outputs_list(model(inputs, training=False))
        except Exception as exc:
            shapes = [np.shape(a) for a in (inputs if isinstance(inputs, list) else [inputs])]
            raise ConfigError(
                f"the model's forward pass failed on a sample of the data (inputs of shapes {shapes} from "
                f"feature_cols {list(config.feature_cols)}): {type(exc).__name__}: {exc}"
            ) from exc
        if len(outs) != len(config.label_cols):
            raise ConfigError(f"the model returns {len(outs)} outputs but there are {len(config.label_cols)} "
                              f"label_cols {list(config.label_cols)}")
        losses = _keras_loss(config.loss)
        losses = list(losses) if isinstance(losses, (list, tuple)) else [losses] * len(outs)
        shapes = []
        for out, name, fn in zip(outs, config.label_cols, losses):
            out_shape = tuple(int(d) for d in out.shape[1:])
            label = align_label(sample[name], out_shape, name)
            try:
                value = fn(label, out)
            except Exception as exc:
                raise ConfigError(
                    f"loss for label {name!r} failed on the label (shape {label.shape}) and the model output "
                    f"(shape {tuple(out.shape)}): {type(exc).__name__}: {exc}"
                ) from exc
            if not np.all(np.isfinite(np.asarray(value))):
                logger.warning("the loss for label %r is not finite on the data sample", name)
            shapes.append(out_shape)
        # the model must survive the trip to the workers
        model_from_bytes(model_to_bytes(model), config.extra.get("custom_objects"), compile=False)
        return {"output_shapes": shapes}

    def freeze_payload(self, config: Any) -> bytes:
        import keras

        optimizer = _keras_optimizer(config.optimizer)
        return freeze({
            "model": model_to_bytes(config.model),
            "optimizer": keras.optimizers.serialize(optimizer),
            "loss": _keras_loss(config.loss),
            "loss_weights": config.loss_weights,
            "metrics": config.metrics,
            "compression": config.gradient_compression,
            "custom_objects": dict(config.extra.get("custom_objects") or {}),
            "output_shapes": None,
        })

    def load_model(self, payload: bytes, weights: bytes) -> Any:
        custom_objects = thaw(payload)["custom_objects"]
        model = model_from_bytes(weights, custom_objects)
        _set_custom_objects(model, custom_objects)
        return model

    def serialize_model(self, model: Any) -> dict[str, bytes]:
        return {MODEL_FILE: model_to_bytes(model), CUSTOM_OBJECTS_FILE: freeze(_get_custom_objects(model))}

    def deserialize_model(self, files: dict[str, bytes]) -> Any:
        custom_objects = thaw(files[CUSTOM_OBJECTS_FILE]) if CUSTOM_OBJECTS_FILE in files else {}
        model = model_from_bytes(files[MODEL_FILE], custom_objects)
        _set_custom_objects(model, custom_objects)
        return model

    def predict(self, model: Any, inputs: Sequence[np.ndarray], input_shapes: Any, batch_size: int) -> list[np.ndarray]:
        n = len(inputs[0]) if inputs else 0
        chunks: list[list[np.ndarray]] = []
        for start in range(0, n, batch_size):
            part = [a[start:start + batch_size] for a in inputs]
            outs = _outputs_list(model.predict_on_batch(to_inputs(part, input_shapes)))
            chunks.append([np.asarray(o, dtype=np.float64) for o in outs])
        if not chunks:
            return []
        return [np.concatenate([c[i] for c in chunks]) for i in range(len(chunks[0]))]

    # ---- worker ------------------------------------------------------------------------
    def setup(self, spec: Any) -> KerasState:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import keras
        import tensorflow as tf

        import hora.keras as hk
        import hora.tensorflow as hvd

        hvd.init()
        gpus = tf.config.list_physical_devices("GPU")
        if spec.use_gpu:
            if not gpus:
                raise ConfigError(f"use_gpu=True but rank {hvd.rank()} sees no GPU (tensorflow-cpu, or none there)")
            try:
                tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
            except RuntimeError as exc:  # TensorFlow already initialized its devices in this process
                logger.warning("could not pin a GPU by local rank: %s", exc)
        keras.utils.set_random_seed(spec.seed)
        payload = thaw(spec.payload)
        custom_objects = payload["custom_objects"]
        model = model_from_bytes(payload["model"], custom_objects, compile=False)
        optimizer = keras.optimizers.deserialize(payload["optimizer"])
        if isinstance(optimizer.learning_rate, keras.optimizers.schedules.LearningRateSchedule) or isinstance(
                getattr(optimizer, "_learning_rate", None), keras.optimizers.schedules.LearningRateSchedule):
            if spec.learning_rate is not None or spec.lr_scaling == "linear":
                raise ConfigError(
                    "the optimizer's learning rate is a LearningRateSchedule: hora cannot override or scale it; pass "
                    "lr_scaling='none' (and scale the schedule yourself) and leave learning_rate unset"
                )
        else:
            lr = spec.learning_rate if spec.learning_rate is not None else float(np.asarray(optimizer.learning_rate))
            scale = hvd.size() if spec.lr_scaling == "linear" else 1
            optimizer.learning_rate = lr * scale
        kwargs: dict[str, Any] = {"backward_passes_per_step": spec.backward_passes_per_step,
                                  "average_aggregated_gradients": True}
        if payload["compression"] is not None:
            kwargs["compression"] = payload["compression"]
        optimizer = hk.DistributedOptimizer(optimizer, **kwargs)
        model.compile(optimizer=optimizer, loss=payload["loss"], loss_weights=payload["loss_weights"],
                      metrics=payload["metrics"], jit_compile=False)
        optimizer.build(model.trainable_variables)
        state = KerasState(
            hvd=hvd, model=model, optimizer=optimizer, feature_cols=tuple(spec.feature_cols),
            label_cols=tuple(spec.label_cols), sample_weight_col=spec.sample_weight_col,
            input_shapes=spec.input_shapes,
            output_shapes=[tuple(int(d) for d in o.shape[1:]) for o in _outputs_list(model.outputs)]
            if getattr(model, "outputs", None) else [],
            custom_objects=custom_objects,
        )
        state.metric_keys = self._probe_metric_keys(state, spec)
        return state

    def _xy(self, state: KerasState, batch: dict[str, np.ndarray]) -> tuple[Any, Any, Any]:
        x = to_inputs([batch[c] for c in state.feature_cols], state.input_shapes)
        labels = []
        for i, name in enumerate(state.label_cols):
            label = _stack(batch[name])
            if i < len(state.output_shapes):
                label = align_label(label, state.output_shapes[i], name)
            labels.append(label)
        y = labels[0] if len(labels) == 1 else labels
        w = None
        if state.sample_weight_col is not None:
            w = np.asarray(batch[state.sample_weight_col], dtype=np.float32).reshape(-1)
        return x, y, w

    def _probe_metric_keys(self, state: KerasState, spec: Any) -> list[str]:
        """The names evaluation returns, from one all-zeros row (builds the compiled metrics on every rank)."""
        cols = spec.dataset.columns
        batch = {c: np.zeros((1, *cols[c].shape), dtype=cols[c].dtype) for c in
                 (*state.feature_cols, *state.label_cols, *([state.sample_weight_col] if state.sample_weight_col else []))}
        if state.sample_weight_col:
            batch[state.sample_weight_col] = np.ones((1,), dtype=np.float32)
        if not state.output_shapes:
            outs = _outputs_list(state.model(to_inputs([batch[c] for c in state.feature_cols], state.input_shapes)))
            state.output_shapes = [tuple(int(d) for d in o.shape[1:]) for o in outs]
        x, y, w = self._xy(state, batch)
        state.model.reset_metrics()
        logs = state.model.test_on_batch(x, y, sample_weight=w, return_dict=True)
        state.model.reset_metrics()
        return sorted(k for k in logs if k != "loss")

    def rank(self, state: KerasState) -> int:
        return state.hvd.rank()

    def size(self, state: KerasState) -> int:
        return state.hvd.size()

    def batches(self, state: KerasState, reader: Any, transform: Any) -> Iterator[tuple]:
        """One pass of ``reader`` through :func:`hora.store.tf_adapter.make_tf_dataset`: ``(x, y[, w])`` tensors.

        ``transform`` runs on the numpy batches inside the adapter; the tensors are then
        shaped for the model by a ``tf.data`` map (float features to float32, the
        ``input_shapes`` reshapes, labels aligned to the outputs, weights to a float32
        vector) and prefetched with ``tf.data.AUTOTUNE``. Exactly ``len(reader)`` batches
        (no ``batch``/``filter``/``repeat`` stage can drop or add one).

        Raises:
            ConfigError: a label that cannot meet its output, a failing ``transform``.
            DataError: a feature whose rows cannot take its ``input_shapes`` entry; reading failed.
        """
        import tensorflow as tf

        from hora.store.tf_adapter import make_tf_dataset

        ds = make_tf_dataset(reader, x_cols=list(state.feature_cols), y_cols=list(state.label_cols),
                             sample_weight_col=state.sample_weight_col, transform=transform)
        convert = self._tf_converter(state, ds.element_spec)
        ds = ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)
        return self._iterate(state, reader, ds)

    def _tf_converter(self, state: KerasState, element_spec: Any) -> Any:
        """The ``tf.data`` map turning the adapter's ``(x, y[, w])`` into the model's inputs, planned from the static spec."""
        import tensorflow as tf

        parts = list(element_spec) if isinstance(element_spec, tuple) else [element_spec]
        fcols, lcols = list(state.feature_cols), list(state.label_cols)

        def split(spec: Any, cols: list) -> list:
            return [spec] if len(cols) == 1 else [spec[c] for c in cols]

        def row_of(spec: Any) -> tuple:
            return tuple(int(d) for d in spec.shape[1:])

        x_plan = []
        for i, (name, spec) in enumerate(zip(fcols, split(parts[0], fcols))):
            cast = tf.float32 if (spec.dtype.is_floating and spec.dtype != tf.float32) or spec.dtype == tf.bool else None
            shape = None
            if state.input_shapes is not None:
                shape = [int(d) for d in state.input_shapes[i]]
                if shape and shape[0] == -1 and all(d >= 0 for d in shape[1:]) and \
                        int(np.prod(shape[1:])) != int(np.prod(row_of(spec))):
                    raise DataError(f"feature {name!r} with per-row shape {row_of(spec)} cannot be reshaped to "
                                    f"input_shapes[{i}]={shape}")
            x_plan.append((cast, shape))
        y_plan = []
        for i, (name, spec) in enumerate(zip(lcols, split(parts[1], lcols) if lcols else [])):
            target = None
            if i < len(state.output_shapes):
                kind = np.dtype(spec.dtype.as_numpy_dtype).kind
                target = _label_target(row_of(spec), kind, tuple(state.output_shapes[i]), name)
            y_plan.append(target)
        weighted = state.sample_weight_col is not None

        def one_or_tuple(items: list) -> Any:
            return items[0] if len(items) == 1 else tuple(items)

        def convert(*batch: Any) -> tuple:
            xs = []
            for t, (cast, shape) in zip([batch[0]] if len(fcols) == 1 else [batch[0][c] for c in fcols], x_plan):
                if cast is not None:
                    t = tf.cast(t, cast)
                if shape is not None:
                    t = tf.reshape(t, shape)
                xs.append(t)
            ys = []
            for t, target in zip([batch[1]] if len(lcols) == 1 else [batch[1][c] for c in lcols], y_plan):
                ys.append(t if target is None else tf.reshape(t, [-1, *target]))
            out = (one_or_tuple(xs), one_or_tuple(ys))
            if weighted:
                out += (tf.reshape(tf.cast(batch[2], tf.float32), [-1]),)
            return out

        return convert

    def _iterate(self, state: KerasState, reader: Any, ds: Any) -> Iterator[tuple]:
        """Iterate ``ds``; a TensorFlow error from reading becomes the original exception (or a DataError)."""
        import tensorflow as tf

        from hora.store.tf_adapter import reader_error

        it = iter(ds)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except tf.errors.OpError as exc:
                original = reader_error(reader)
                if original is not None:
                    raise original from exc
                raise DataError(
                    f"rank {state.hvd.rank()}: preparing a {reader.split!r} batch for the Keras model failed: "
                    f"{type(exc).__name__}: {exc.message}"
                ) from exc
            yield batch

    def _unpack(self, state: KerasState, batch: Any) -> tuple[Any, Any, Any]:
        """``(x, y, w)`` for Keras from a :meth:`batches` item (or, for other callers, a numpy batch dict)."""
        if isinstance(batch, dict):
            return self._xy(state, batch)
        x, y = batch[0], batch[1]
        w = batch[2] if len(batch) > 2 else None
        return (list(x) if isinstance(x, tuple) else x), (list(y) if isinstance(y, tuple) else y), w

    def train_step(self, state: KerasState, batch: Any, step: int) -> float:
        """One ``train_on_batch`` on a :meth:`batches` item ``(x, y[, w])``; returns this batch's loss.

        Raises:
            DataError: the loss is not finite (names the step and the rank).
        """
        x, y, w = self._unpack(state, batch)
        state.model.reset_metrics()  # the returned loss is this batch's, not a running mean
        logs = state.model.train_on_batch(x, y, sample_weight=w, return_dict=True)
        value = float(logs["loss"])
        if not math.isfinite(value):
            raise DataError(f"training loss became {value} at step {step} on rank {state.hvd.rank()}")
        return value

    def eval_keys(self, state: KerasState) -> list[str]:
        return ["loss", "_n", *state.metric_keys]

    def eval_batch(self, state: KerasState, batch: Any) -> dict[str, float]:
        """``test_on_batch`` on a :meth:`batches` item; loss and metrics as sums over its rows."""
        x, y, w = self._unpack(state, batch)
        first = y[0] if isinstance(y, list) else y
        n = int(first.shape[0])
        state.model.reset_metrics()
        logs = state.model.test_on_batch(x, y, sample_weight=w, return_dict=True)
        out = {"loss": float(logs["loss"]) * n, "_n": float(n)}
        for key in state.metric_keys:
            out[key] = float(np.mean(np.asarray(logs[key]))) * n
        return out

    def allreduce_sum(self, state: KerasState, values: np.ndarray) -> np.ndarray:
        import hora.native as hn

        arr = np.ascontiguousarray(values, dtype=np.float64)
        if hn.size() == 1:
            return arr.copy()
        return np.asarray(hn.allreduce(arr, op=hn.Sum, name="hora.estimators.metrics")).copy()

    def broadcast_initial(self, state: KerasState) -> None:
        state.hvd.broadcast_variables(state.model.variables, root_rank=0)
        state.hvd.broadcast_variables(state.optimizer.variables, root_rank=0)

    def state_bytes(self, state: KerasState, extra: dict[str, Any]) -> bytes:
        return pickle.dumps({"model": model_to_bytes(state.model), "extra": extra}, protocol=pickle.HIGHEST_PROTOCOL)

    def load_state(self, state: KerasState, data: bytes) -> dict[str, Any]:
        ckpt = pickle.loads(data)
        saved = model_from_bytes(ckpt["model"], state.custom_objects, compile=True)
        state.model.set_weights(saved.get_weights())
        saved_opt = getattr(saved, "optimizer", None)
        if saved_opt is not None and getattr(saved_opt, "built", False):
            mine, theirs = state.optimizer.variables, saved_opt.variables
            if len(mine) == len(theirs) and all(tuple(a.shape) == tuple(b.shape) for a, b in zip(mine, theirs)):
                for a, b in zip(mine, theirs):
                    a.assign(b)
            else:
                logger.warning("the checkpoint's optimizer state does not match this optimizer; it starts fresh")
        return dict(ckpt.get("extra", {}))

    def weights_bytes(self, state: KerasState) -> bytes:
        return model_to_bytes(state.model)


# ---------------------------------------------------------------------------------------
# the faces
# ---------------------------------------------------------------------------------------
CUSTOM_OBJECTS_DOC = "{name: class or function} needed to load the Keras model (custom layers, losses)"


def _config_from(params: dict[str, Any], custom_objects: Any) -> EstimatorConfig:
    if custom_objects is not None and not isinstance(custom_objects, dict):
        raise ConfigError(f"custom_objects must be a dict of name -> class or function, got {custom_objects!r}")
    config = EstimatorConfig.from_params(keras_params(params))
    config.extra["custom_objects"] = dict(custom_objects or {})
    return config


def _clone(model: Any) -> Any:
    if model is None:
        return None
    clone = model_from_bytes(model_to_bytes(model), _get_custom_objects(model))
    _set_custom_objects(clone, _get_custom_objects(model))
    return clone


# ---- Dask ---------------------------------------------------------------------------------
from hora.estimators.dask_estimator import DaskEstimatorBase, DaskModelBase  # noqa: E402


class DaskKerasModel(DaskModelBase):
    """A fitted Keras model on the Dask face; ``model_`` is the trained ``keras.Model``."""

    trainer_class = KerasTrainer

    def __deepcopy__(self, memo: dict) -> DaskKerasModel:
        import copy

        new = copy.copy(self)
        new.model_ = _clone(self.model_)
        new.history_ = copy.deepcopy(self.history_, memo)
        new._files = None
        return new


class DaskKerasEstimator(DaskEstimatorBase):
    """Train a Keras 3 model data-parallel on a Dask DataFrame (scikit-learn conventions).

    Parameters: those of :data:`hora.estimators.params.PARAM_DOCS` plus ``custom_objects``
    (see :mod:`hora.estimators.keras`). ``fit(ddf)`` returns a :class:`DaskKerasModel`.
    """

    trainer_class = KerasTrainer
    model_class = DaskKerasModel
    _param_names = (*PARAM_DEFAULTS, "custom_objects")

    def __init__(self, **params: Any) -> None:
        unknown = set(params) - set(self._param_names)
        if unknown:
            raise TypeError(f"{type(self).__name__} got unknown parameters {sorted(unknown)}")
        for name in PARAM_DEFAULTS:
            setattr(self, name, params.get(name, PARAM_DEFAULTS[name]))
        self.custom_objects = params.get("custom_objects")

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.get_params().items() if k != "custom_objects"}
        changed = {k: v for k, v in shown.items() if v is not PARAM_DEFAULTS[k] and v != PARAM_DEFAULTS[k]}
        text = ", ".join(f"{k}={type(v).__name__ if k in ('model', 'optimizer', 'store') else repr(v)}"
                         for k, v in changed.items())
        return f"{type(self).__name__}({text})"

    def _config(self) -> EstimatorConfig:
        params = self.get_params()
        custom_objects = params.pop("custom_objects")
        return _config_from(params, custom_objects)


# ---- Spark --------------------------------------------------------------------------------
try:
    from pyspark import keyword_only
except ImportError:  # pragma: no cover - the Spark face needs pyspark
    SparkKerasEstimator = SparkKerasModel = None  # type: ignore[assignment]
else:
    import hora.estimators.spark_estimator as _se

    HasCustomObjects = _se.make_param_mixin("custom_objects", CUSTOM_OBJECTS_DOC)

    class SparkKerasModel(_se.SparkModelBase):
        """A fitted Keras model as an MLlib ``Model`` (``getModel()`` is the trained ``keras.Model``)."""

        trainer_class = KerasTrainer

        def copy(self, extra: dict | None = None) -> SparkKerasModel:
            """A copy with the same uid and params (plus ``extra``) and its own clone of the trained model."""
            model, self._model = self._model, None
            try:
                that = super().copy(extra)
            finally:
                self._model = model
            that._model = _clone(model)
            that._files = None
            return that

    class SparkKerasEstimator(_se.SparkEstimatorBase, HasCustomObjects):
        """Train a Keras 3 model data-parallel on a Spark DataFrame; ``fit`` returns a :class:`SparkKerasModel`.

        Params: those of :data:`hora.estimators.params.PARAM_DOCS` plus ``custom_objects``
        (see :mod:`hora.estimators.keras`), each a Spark Param with get/set accessors.
        """

        trainer_class = KerasTrainer
        model_class = SparkKerasModel

        @keyword_only
        def __init__(self, **kwargs: Any) -> None:
            _se.SparkEstimatorBase.__init__(self, **self._input_kwargs)

        @keyword_only
        def setParams(self, **kwargs: Any) -> SparkKerasEstimator:  # noqa: N802 (MLlib's name)
            """Set any of the estimator's params (the shared ones and ``custom_objects``) by keyword."""
            kwargs = dict(self._input_kwargs)
            custom = {"custom_objects": kwargs.pop("custom_objects")} if "custom_objects" in kwargs else {}
            _se.SparkEstimatorBase.setParams(self, **kwargs)
            self._setDefault(custom_objects=None)
            return self._set(**custom)

        def _config(self) -> EstimatorConfig:
            params = {name: self.getOrDefault(name) for name in PARAM_DEFAULTS}
            return _config_from(params, self.getOrDefault("custom_objects"))

        def _save_to(self, path: str, spark: Any) -> None:
            from pyspark.ml.util import DefaultParamsWriter

            from hora.estimators import persistence

            json_params, objects = _se._split_params(self, [*PARAM_DEFAULTS, "custom_objects"])
            DefaultParamsWriter.saveMetadata(self, path, spark, extraMetadata={"hora": "estimator"},
                                             paramMap=json_params)
            persistence.save_objects(os.path.join(path, _se.SIDE_DIR), {"class": persistence.class_path(self)},
                                     objects)


__all__ = [
    "KerasTrainer", "KerasState", "DaskKerasEstimator", "DaskKerasModel", "SparkKerasEstimator", "SparkKerasModel",
    "model_to_bytes", "model_from_bytes", "keras_params",
]
