"""The framework hooks protocol: what a deep-learning framework must provide to the core.

The fit pipeline (:mod:`hora.estimators.core`) and the worker loop
(:mod:`hora.estimators.worker`) are framework-neutral. Everything that touches
tensors goes through one :class:`Trainer` object, picklable and stateless (all
per-run state lives in the ``state`` object its :meth:`Trainer.setup` returns).
:class:`hora.estimators.torch_trainer.TorchTrainer` is the PyTorch implementation;
a Keras or Lightning trainer implements the same methods.

Driver side:
    * :meth:`Trainer.check` validates model/optimizer/loss against a small numpy sample
      of the data (one forward pass) and returns the per-row output shapes.
    * :meth:`Trainer.freeze_payload` turns the config's framework objects into bytes.
    * :meth:`Trainer.load_model` rebuilds the trained model from the payload and the
      final weights; :meth:`Trainer.predict` runs batched inference on numpy inputs.
    * :meth:`Trainer.serialize_model` / :meth:`Trainer.deserialize_model` persist a
      trained model (definition + weights) as bytes.

Worker side (every rank, in this order): :meth:`setup`, :meth:`load_state` (resume),
:meth:`broadcast_initial`, then per epoch :meth:`train_step` per batch and
:meth:`eval_batch` per validation batch (the batches are what :meth:`batches` makes
of each pass of the store reader: numpy dicts by default, ``tf.data`` batches for
Keras), :meth:`allreduce_sum` for cross-rank
averages, :meth:`state_bytes` for checkpoints and :meth:`weights_bytes` for the result.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np


class Trainer:
    """Base class documenting the hooks; every method raises until a framework overrides it."""

    #: short framework name ("torch", "keras", ...), used in persisted metadata
    name: str = "base"

    # ---- driver ------------------------------------------------------------------------
    def check(self, config: Any, sample: dict[str, np.ndarray]) -> dict[str, Any]:
        """Validate the config's model, optimizer, loss and metrics on ``sample`` (column -> array).

        Returns:
            ``{"output_shapes": [per-row shape of each output, one per label]}``.

        Raises:
            ConfigError: model/optimizer/loss unusable, or a label shape that does not
                match the model output (message names the label and both shapes).
        """
        raise NotImplementedError(f"{type(self).__name__}.check is not implemented")

    def freeze_payload(self, config: Any) -> bytes:
        """Serialize the framework objects of ``config`` (model, optimizer, loss, metrics, ...)."""
        raise NotImplementedError(f"{type(self).__name__}.freeze_payload is not implemented")

    def load_model(self, payload: bytes, weights: bytes) -> Any:
        """The trained model: the payload's model definition with ``weights`` loaded."""
        raise NotImplementedError(f"{type(self).__name__}.load_model is not implemented")

    def serialize_model(self, model: Any) -> dict[str, bytes]:
        """Named side files persisting a trained model (e.g. ``model.pkl``, ``weights.pt``)."""
        raise NotImplementedError(f"{type(self).__name__}.serialize_model is not implemented")

    def deserialize_model(self, files: dict[str, bytes]) -> Any:
        """Inverse of :meth:`serialize_model`."""
        raise NotImplementedError(f"{type(self).__name__}.deserialize_model is not implemented")

    def predict(self, model: Any, inputs: Sequence[np.ndarray], input_shapes: Any, batch_size: int) -> list[np.ndarray]:
        """Run the model on feature arrays (one per feature column); one output array per label."""
        raise NotImplementedError(f"{type(self).__name__}.predict is not implemented")

    # ---- worker ------------------------------------------------------------------------
    def setup(self, spec: Any) -> Any:
        """Initialise the collective library, rebuild model and optimizer from ``spec``; returns the state."""
        raise NotImplementedError(f"{type(self).__name__}.setup is not implemented")

    def rank(self, state: Any) -> int:
        raise NotImplementedError

    def size(self, state: Any) -> int:
        raise NotImplementedError

    def load_state(self, state: Any, data: bytes) -> dict[str, Any]:
        """Load a checkpoint written by :meth:`state_bytes`; returns its extra fields (epoch, history)."""
        raise NotImplementedError

    def broadcast_initial(self, state: Any) -> None:
        """Make every rank start from rank 0's model and optimizer state."""
        raise NotImplementedError

    def batches(
        self, state: Any, reader: Any, transform: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None
    ) -> Iterable[Any]:
        """What the worker loop iterates for one pass of ``reader`` (a :class:`hora.store.reader.Reader`).

        Each item is handed as is to :meth:`train_step` or :meth:`eval_batch`. It must
        yield exactly ``len(reader)`` items (the reader gives every rank the same
        number of batches; the worker checks that the hook keeps it so). ``transform``
        (the estimator's ``transformation_fn``, or None) must be applied to every numpy
        batch dict before anything else. The default yields the reader's numpy dicts.
        """
        if transform is None:
            return reader
        return (transform(batch) for batch in reader)

    def train_step(self, state: Any, batch: Any, step: int) -> float:
        """One training batch (forward, backward, optimizer step when due); returns the loss."""
        raise NotImplementedError

    def eval_batch(self, state: Any, batch: Any) -> dict[str, float]:
        """One validation batch: ``{"loss": sum of losses, "<metric>": sum, ..., "_n": rows}``."""
        raise NotImplementedError

    def finish_epoch(self, state: Any, steps: int) -> None:
        """Called after the last training batch of an epoch (e.g. step a partial accumulation window)."""

    def eval_keys(self, state: Any) -> list[str]:
        """Every key :meth:`eval_batch` and :meth:`eval_finish` can return, the same on every rank."""
        raise NotImplementedError

    def eval_finish(self, state: Any) -> dict[str, float]:
        """Per-epoch sums of stateful metrics (e.g. torchmetrics), ``{name: value * rows}``; resets them."""
        return {}

    def allreduce_sum(self, state: Any, values: np.ndarray) -> np.ndarray:
        """Sum a float64 vector across ranks."""
        raise NotImplementedError

    def state_bytes(self, state: Any, extra: dict[str, Any]) -> bytes:
        """A checkpoint: model, optimizer and ``extra`` (epoch, history)."""
        raise NotImplementedError

    def weights_bytes(self, state: Any) -> bytes:
        """The model weights only (the fit's result)."""
        raise NotImplementedError

    def set_train(self, state: Any, training: bool) -> None:
        """Switch between training and evaluation mode."""

    def teardown(self, state: Any) -> None:
        """Release what :meth:`setup` acquired."""


__all__ = ["Trainer"]
