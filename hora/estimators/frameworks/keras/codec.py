"""Keras 3 (TensorFlow backend) on the estimator seam: :class:`KerasCodec` (driver), :data:`KERAS`.

``hora.spark.KerasEstimator`` / ``hora.dask.KerasEstimator`` take the shared parameters
plus :class:`KerasConfig`'s (``custom_objects``, ``checkpoint_callback``):

* ``model``: a ``keras.Model`` (functional, sequential or subclassed with
  ``get_config``); it travels to the workers in the ``.keras`` format.
* ``optimizer``: a Keras 3 optimizer instance (or its name, ``"adam"``); each worker
  rebuilds it from its config, scales its learning rate (``lr_scaling``) and wraps it
  in :func:`hora.keras.DistributedOptimizer`.
* ``loss``: a Keras loss object or function (or its name, ``"mse"``), or one per label;
  ``metrics``: what ``model.compile(metrics=...)`` accepts.
* ``callbacks``: hora's callbacks and Keras callbacks (``keras.callbacks.TensorBoard``,
  ``EarlyStopping``, ``ReduceLROnPlateau``, ...), run by every rank with the
  rank-averaged epoch logs, as Horovod runs them; a ``TensorBoard`` callback runs on
  rank 0 and writes to the run's ``logs`` folder in the store.
* ``checkpoint_callback``: a ``keras.callbacks.ModelCheckpoint`` run on rank 0 with its
  file in the run's folder; the fitted model is the one it saved last (with
  ``save_best_only``, the best epoch's), as in Horovod.
* ``custom_objects``: ``{name: class or function}`` needed to load the model.

Conventions: the model is called with one input per ``feature_cols`` entry (a single
tensor for one, a list for several). Without ``input_shapes`` each input is reshaped to
the model's own input shape when their values per row match (a flat 784-vector feeds a
``(28, 28, 1)`` input, as in Horovod); floating features are cast to float32; one
output per label column, labels aligned to their outputs (``(n,)`` vs ``(n, 1)``;
class ids (integers or Spark's doubles) for an ``(n, classes)`` output stay ids; one-hot vectors stay).
The worker side is :class:`hora.estimators.frameworks.keras.session.KerasSession`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from hora.errors import ConfigError
from hora.estimators.data.frames import hint_grouping
from hora.estimators.framework import CheckResult, Framework, ModelCodec, register
from hora.estimators.frameworks.keras.io import (
    CUSTOM_OBJECTS_FILE, MODEL_FILE, align_label, clone_model, get_custom_objects, is_keras_callback, keras_loss,
    keras_optimizer, keras_params, model_from_bytes, model_to_bytes, outputs_list, set_custom_objects, to_inputs,
)
from hora.estimators.frameworks.keras.session import KerasSession
from hora.estimators.params import EstimatorConfig, param
from hora.estimators.spec import freeze, thaw

logger = logging.getLogger(__name__)


@dataclass
class KerasConfig(EstimatorConfig):
    """The Keras estimator's parameters: the shared ones and Keras' own."""

    custom_objects: dict | None = param(None, "{name: class or function} needed to load the Keras model (custom "
                                        "layers, losses)", "pickle")
    checkpoint_callback: Any = param(None, "a keras.callbacks.ModelCheckpoint run on rank 0; the fitted model is the "
                                     "one it saved last", "pickle")
    tensorflow_dataset_prefetch_buffer_size: int | None = param(
        None, "ignored (Horovod's tf.data knob)", ignored="a knob of Horovod's tf.data pipeline; hora prefetches "
        "with tf.data.AUTOTUNE")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.custom_objects is not None and not isinstance(self.custom_objects, dict):
            raise ConfigError(f"custom_objects must be a dict of name -> class or function, got {self.custom_objects!r}")
        if self.checkpoint_callback is not None:
            import keras

            if not isinstance(self.checkpoint_callback, keras.callbacks.ModelCheckpoint):
                raise ConfigError("checkpoint_callback must be a keras.callbacks.ModelCheckpoint, got "
                                  f"{type(self.checkpoint_callback).__name__}")

    @classmethod
    def accepts_callback(cls, cb: Any) -> bool:
        return super().accepts_callback(cb) or is_keras_callback(cb)

    @classmethod
    def callback_kinds(cls) -> str:
        return "hora.estimators.callbacks.Callback or keras.callbacks.Callback instances"


def model_input_shapes(model: Any, sample_inputs: Sequence[np.ndarray]) -> list[list[int]] | None:
    """The shapes to reshape the sample's inputs to so they meet the model's inputs (None when they already do).

    A stored per-row shape whose size equals a known model input shape is reshaped to
    it, as Horovod does (a flat 784-vector for a ``(28, 28, 1)`` input).
    """
    model_inputs = getattr(model, "inputs", None)
    if not model_inputs or len(model_inputs) != len(sample_inputs):
        return None
    shapes, needed = [], False
    for tensor, arr in zip(model_inputs, sample_inputs):
        row = tuple(int(d) for d in np.shape(arr)[1:])
        dims = tuple(tensor.shape[1:])
        if row != dims and all(d is not None for d in dims) and int(np.prod(dims)) == int(np.prod(row)):
            shapes.append([-1, *[int(d) for d in dims]])
            needed = True
        else:
            shapes.append([-1, *row])
    return shapes if needed else None


class KerasCodec(ModelCodec):
    """Driver side of Keras 3 (see :class:`~hora.estimators.framework.ModelCodec`)."""

    name = "keras"

    def check(self, config: Any, sample: dict[str, np.ndarray]) -> CheckResult:
        import keras

        from hora.keras.optimizer import check_keras3_optimizer

        model = config.model
        if not isinstance(model, keras.Model):
            mod = type(model).__module__
            hint = " (a tf_keras / Keras 2 model: build it with `import keras`, Keras 3)" if mod.startswith(
                ("tf_keras", "tensorflow.python.keras")) else ""
            raise ConfigError(f"model must be a keras.Model, got {mod}.{type(model).__name__}{hint}")
        check_keras3_optimizer(keras_optimizer(config.optimizer), "KerasEstimator: optimizer")
        features = config.features
        raw = [sample[k] for k in features.keys]
        input_shapes = config.input_shapes if config.input_shapes is not None else model_input_shapes(model, raw)
        inputs = to_inputs(raw, input_shapes)
        try:
            outs = outputs_list(model(inputs, training=False))
        except Exception as exc:
            shapes = [np.shape(a) for a in (inputs if isinstance(inputs, list) else [inputs])]
            raise ConfigError(
                f"the model's forward pass failed on a sample of the data (inputs of shapes {shapes} from "
                f"feature_cols {config.feature_cols}): {type(exc).__name__}: {exc}{hint_grouping(features)}"
            ) from exc
        if len(outs) != len(config.label_cols):
            raise ConfigError(f"the model returns {len(outs)} outputs but there are {len(config.label_cols)} "
                              f"label_cols {list(config.label_cols)}")
        losses = keras_loss(config.loss)
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
        model_from_bytes(model_to_bytes(model), config.custom_objects, compile=False)
        return CheckResult(output_shapes=shapes, input_shapes=input_shapes)

    def freeze(self, config: Any) -> bytes:
        import keras

        native = [cb for cb in config.callbacks or [] if is_keras_callback(cb)]
        return freeze({
            "model": model_to_bytes(config.model),
            "optimizer": keras.optimizers.serialize(keras_optimizer(config.optimizer)),
            "loss": keras_loss(config.loss),
            "loss_weights": config.loss_weights,
            "metrics": config.metrics,
            "compression": config.gradient_compression,
            "custom_objects": dict(config.custom_objects or {}),
            "callbacks": native,
            "checkpoint_callback": config.checkpoint_callback,
        })

    def load(self, payload: bytes, weights: bytes) -> Any:
        custom_objects = thaw(payload)["custom_objects"]
        model = model_from_bytes(weights, custom_objects)
        set_custom_objects(model, custom_objects)
        return model

    def serialize(self, model: Any) -> dict[str, bytes]:
        return {MODEL_FILE: model_to_bytes(model), CUSTOM_OBJECTS_FILE: freeze(get_custom_objects(model))}

    def deserialize(self, files: dict[str, bytes]) -> Any:
        custom_objects = thaw(files[CUSTOM_OBJECTS_FILE]) if CUSTOM_OBJECTS_FILE in files else {}
        model = model_from_bytes(files[MODEL_FILE], custom_objects)
        set_custom_objects(model, custom_objects)
        return model

    def predict(self, model: Any, inputs: Sequence[np.ndarray], input_shapes: Any, batch_size: int) -> list[np.ndarray]:
        n = len(inputs[0]) if inputs else 0
        chunks: list[list[np.ndarray]] = []
        for start in range(0, n, batch_size):
            part = [a[start:start + batch_size] for a in inputs]
            outs = outputs_list(model.predict_on_batch(to_inputs(part, input_shapes)))
            chunks.append([np.asarray(o, dtype=np.float64) for o in outs])
        if not chunks:
            return []
        return [np.concatenate([c[i] for c in chunks]) for i in range(len(chunks[0]))]

    def clone(self, model: Any) -> Any:
        return clone_model(model)


KERAS = register(Framework(name="keras", codec=KerasCodec(), session=KerasSession, config=KerasConfig,
                           model_kind="a keras.Model", prepare=keras_params, modules=("tensorflow", "keras")))

__all__ = ["KERAS", "KerasConfig", "KerasCodec", "KerasSession", "model_input_shapes", "model_to_bytes",
           "model_from_bytes", "keras_params"]
