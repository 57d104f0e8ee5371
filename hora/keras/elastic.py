"""Elastic Keras training (Horovod's ``horovod.tensorflow.keras.elastic``).

::

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)

    @hvd.elastic.run
    def train(state):
        model.fit(dataset, steps_per_epoch=..., epochs=epochs - state.epoch, callbacks=[
            hvd.elastic.CommitStateCallback(state),
            hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.UpdateEpochStateCallback(state),
        ])

    train(state)

A failed collective inside ``fit`` (a ``HorovodInternalError``, which TensorFlow hands
back as an ``OpError`` from the train step) restores the last commit and calls
``train`` again (see :mod:`hora.tensorflow.elastic`).
"""

from __future__ import annotations

from typing import Any

import keras

from hora.tensorflow.elastic import TensorFlowKerasState, run


class KerasState(TensorFlowKerasState):
    """A Keras model (and its optimizer) with picklable attributes (``batch=0, epoch=0``)."""

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        super().__init__(model, optimizer=optimizer, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commit ``state`` every ``batches_per_commit`` batches and at the end of each epoch."""

    def __init__(self, state: Any, batches_per_commit: int = 1) -> None:
        super().__init__()
        if not isinstance(batches_per_commit, int) or batches_per_commit < 1:
            from hora.errors import ConfigError

            raise ConfigError(f"CommitStateCallback: batches_per_commit must be an int >= 1, "
                              f"got {batches_per_commit!r}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.batches_remaining = self.batches_per_commit  # the same count on every rank after a reset

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` at the current batch (0 again at the end of each epoch).

    With ``steps_per_epoch`` the first epoch after a reset is reported as shortened by
    the batches already done (``params['steps']``, as Horovod); Keras 3 still runs the
    ``steps_per_epoch`` it was given, so pass the remaining steps to ``fit`` yourself.
    """

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.steps_per_epoch: int | None = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params.get("steps")
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` at the global epoch count (Keras restarts at 0 after a reset)."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = self.state.epoch

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        # +1: a reset after state.batch went back to 0 must not repeat the finished epoch
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
