"""Keras pieces for the estimator tests, importable by the Spark/Dask workers."""

from __future__ import annotations

import keras


class ScaledDense(keras.layers.Layer):
    """A Dense layer with a fixed output scale; deliberately *not* registered with Keras,
    so loading a model that uses it needs ``custom_objects``."""

    def __init__(self, units: int, scale: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.scale = scale
        self.dense = keras.layers.Dense(units)

    def build(self, input_shape):
        self.dense.build(input_shape)

    def call(self, x):
        return self.dense(x) * self.scale

    def get_config(self):
        return {**super().get_config(), "units": self.units, "scale": self.scale}


def digits_mlp(custom: bool = False) -> keras.Model:
    """A small classifier of the 64 digits pixels (softmax output)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((64,))
    h = keras.layers.Dense(32, activation="relu")(inputs)
    logits = ScaledDense(10, scale=1.0)(h) if custom else keras.layers.Dense(10)(h)
    return keras.Model(inputs, keras.layers.Softmax()(logits))


def digits_cnn() -> keras.Model:
    """The digits CNN of the examples and benchmark (input 8x8x1, softmax over 10)."""
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
