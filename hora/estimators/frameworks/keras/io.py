"""Keras pieces shared by the driver's codec and the workers' session: the ``.keras`` format, arrays in and out."""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any, Sequence

import numpy as np

from hora.errors import ConfigError, DataError

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


def set_custom_objects(model: Any, custom_objects: dict | None) -> None:
    # not a Keras-tracked attribute: a plain dict of classes on the instance
    object.__setattr__(model, "_hora_custom_objects", dict(custom_objects or {}))


def get_custom_objects(model: Any) -> dict:
    return dict(getattr(model, "_hora_custom_objects", {}) or {})


# ---------------------------------------------------------------------------------------
# arrays in, arrays out
# ---------------------------------------------------------------------------------------
def stack(arr: Any) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.dtype == object:
        arr = np.stack([np.asarray(v) for v in arr])
    return arr


def to_inputs(arrays: Sequence[np.ndarray], input_shapes: Any) -> Any:
    """Feature arrays -> what the model is called with (one array, or a list)."""
    out = []
    for i, arr in enumerate(arrays):
        arr = stack(arr)
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


def label_target(row: tuple, kind: str, out_shape: tuple, name: str) -> tuple | None:
    """How a label of per-row shape ``row`` (numpy dtype kind ``kind``) meets an output of
    per-row shape ``out_shape``: None (as it is) or the per-row shape to reshape it to.

    Raises:
        ConfigError: incompatible per-row shapes (names the label and both shapes).
    """
    if row == out_shape:
        return None
    if kind in "iuf" and len(out_shape) >= 1 and out_shape[-1] > 1 and row == out_shape[:-1]:
        return None  # class ids (integers, or Spark's doubles) for a (classes,) output
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
    label = stack(label)
    target = label_target(tuple(label.shape[1:]), label.dtype.kind, tuple(out_shape), name)
    return label if target is None else label.reshape((label.shape[0], *target))


def outputs_list(out: Any) -> list:
    if isinstance(out, dict):
        return list(out.values())
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]


def keras_loss(loss: Any) -> Any:
    import keras

    if isinstance(loss, (list, tuple)):
        return [keras_loss(item) for item in loss]
    if isinstance(loss, str):
        try:
            return keras.losses.get(loss)
        except ValueError as exc:
            raise ConfigError(f"loss {loss!r} is not a Keras loss name: {exc}") from exc
    return loss


def keras_optimizer(optimizer: Any) -> Any:
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
        params["loss"] = keras_loss(params["loss"])
    if params.get("optimizer") is not None:
        params["optimizer"] = keras_optimizer(params["optimizer"])
    return params


def clone_model(model: Any) -> Any:
    """An independent copy of a Keras model (through the ``.keras`` format), custom objects kept."""
    if model is None:
        return None
    custom = get_custom_objects(model)
    clone = model_from_bytes(model_to_bytes(model), custom)
    set_custom_objects(clone, custom)
    return clone


def is_keras_callback(cb: Any) -> bool:
    """Whether ``cb`` is a ``keras.callbacks.Callback`` (without importing Keras for other objects)."""
    if not any(k.__module__.split(".")[0] in ("keras", "tensorflow", "tf_keras") for k in type(cb).__mro__):
        return False
    import keras

    return isinstance(cb, keras.callbacks.Callback)


__all__ = ["model_to_bytes", "model_from_bytes", "set_custom_objects", "get_custom_objects", "stack", "to_inputs",
           "label_target", "align_label", "outputs_list", "keras_loss", "keras_optimizer", "keras_params",
           "clone_model", "is_keras_callback", "MODEL_FILE", "CUSTOM_OBJECTS_FILE"]
