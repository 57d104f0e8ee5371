"""``hora.keras.DistributedOptimizer`` for Keras 3: implemented in
:mod:`hora.tensorflow.keras_optimizer` (``hora.tensorflow.DistributedOptimizer`` hands Keras
optimizers to it, and TensorFlow's API must not import the Keras one built on it)."""

from hora.tensorflow.keras_optimizer import (
    DistributedOptimizer,
    check_keras3_optimizer,
    is_distributed_optimizer,
    make_distributed_in_place,
)

__all__ = ["DistributedOptimizer", "is_distributed_optimizer", "check_keras3_optimizer", "make_distributed_in_place"]
