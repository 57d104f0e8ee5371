"""The Keras worker: :class:`KerasSession`, one rank's Keras 3 training run inside the shared loop.

Each worker reads its batches through the store reader's ``tf.data`` adapter
(:func:`hora.store.tf_adapter.make_tf_dataset`, see :meth:`KerasSession.batches`), one
compiled ``train_on_batch`` per batch of tensors; rank 0's checkpoints are the model
(with its optimizer state) in the ``.keras`` format, and so is the fit's result. The
user's Keras callbacks run here with the rank-averaged epoch logs (a ``TensorBoard``
on rank 0 only, writing to the run's ``logs``); ``checkpoint_callback`` runs on rank 0
with its file in the run's folder and decides the returned model.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from hora.errors import ConfigError, DataError
from hora.estimators.framework import Resume, TrainingSession
from hora.estimators.frameworks.keras.io import (
    align_label, label_target, model_from_bytes, model_to_bytes, outputs_list, set_custom_objects, stack, to_inputs,
)
from hora.estimators.spec import thaw

logger = logging.getLogger(__name__)


@dataclass
class KerasSession(TrainingSession):
    """One Keras rank's run: the compiled model and its DistributedOptimizer, as attributes."""

    hvd: Any
    model: Any
    optimizer: Any
    feature_keys: tuple
    label_cols: tuple
    sample_weight_col: str | None
    input_shapes: Any
    output_shapes: list
    metric_keys: list = field(default_factory=list)
    custom_objects: dict = field(default_factory=dict)
    callbacks: Any = None  # keras.callbacks.CallbackList of the user's Keras callbacks
    checkpoint_path: str | None = None  # checkpoint_callback's file on rank 0
    codec: Any = None  # the framework's codec (model_files)
    uploads: list = field(default_factory=list)  # (local dir, store, remote dir) to copy to a remote store
    final_model: bytes | None = None

    @classmethod
    def open(cls, spec: Any) -> "KerasSession":
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import keras
        import tensorflow as tf

        import hora.keras as hk
        import hora.tensorflow as hvd

        config = spec.config
        hvd.init()
        gpus = tf.config.list_physical_devices("GPU")
        if config.use_gpu:
            if not gpus:
                raise ConfigError(f"use_gpu=True but rank {hvd.rank()} sees no GPU (tensorflow-cpu, or none there)")
            try:
                tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
            except RuntimeError as exc:  # TensorFlow already initialized its devices in this process
                logger.warning("could not pin a GPU by local rank: %s", exc)
        keras.utils.set_random_seed(config.seed)
        payload = thaw(spec.payload)
        custom_objects = payload["custom_objects"]
        model = model_from_bytes(payload["model"], custom_objects, compile=False)
        optimizer = keras.optimizers.deserialize(payload["optimizer"])
        schedule = keras.optimizers.schedules.LearningRateSchedule
        if isinstance(optimizer.learning_rate, schedule) or isinstance(getattr(optimizer, "_learning_rate", None), schedule):
            if config.learning_rate is not None or config.lr_scaling == "linear":
                raise ConfigError(
                    "the optimizer's learning rate is a LearningRateSchedule: hora cannot override or scale it; pass "
                    "lr_scaling='none' (and scale the schedule yourself) and leave learning_rate unset"
                )
        else:
            lr = config.learning_rate if config.learning_rate is not None else float(np.asarray(optimizer.learning_rate))
            optimizer.learning_rate = lr * (hvd.size() if config.lr_scaling == "linear" else 1)
        kwargs: dict[str, Any] = {"backward_passes_per_step": config.backward_passes_per_step,
                                  "average_aggregated_gradients": True}
        if payload["compression"] is not None:
            kwargs["compression"] = payload["compression"]
        optimizer = hk.DistributedOptimizer(optimizer, **kwargs)
        model.compile(optimizer=optimizer, loss=payload["loss"], loss_weights=payload["loss_weights"],
                      metrics=payload["metrics"], jit_compile=False)
        optimizer.build(model.trainable_variables)
        session = cls(hvd=hvd, model=model, optimizer=optimizer, feature_keys=tuple(config.features.keys),
                      label_cols=tuple(config.label_cols), sample_weight_col=config.sample_weight_col,
                      input_shapes=config.input_shapes, output_shapes=[tuple(s) for s in spec.output_shapes],
                      custom_objects=custom_objects, codec=spec.framework.codec)
        session.metric_keys = session._probe_metric_keys(spec)
        session._open_callbacks(spec, payload.get("callbacks") or [], payload.get("checkpoint_callback"))
        return session

    # the user's Keras callbacks --------------------------------------------------------------
    def _open_callbacks(self, spec: Any, native: list, checkpoint_callback: Any) -> None:
        import keras

        if not native and checkpoint_callback is None:
            return
        store, rank = spec.store, self.rank
        chosen = []
        for cb in native:
            if isinstance(cb, keras.callbacks.TensorBoard):
                if rank != 0:
                    continue
                cb.log_dir = self._local_dir(store, store.layout.logs_dir(spec.run_id))
                logger.info("keras TensorBoard callback writes to %s", store.layout.logs_dir(spec.run_id))
            chosen.append(cb)
        if checkpoint_callback is not None and rank == 0:
            name = "checkpoint.weights.h5" if checkpoint_callback.save_weights_only else "checkpoint.keras"
            folder = self._local_dir(store, store.layout.run_dir(spec.run_id) + "/keras-checkpoint")
            checkpoint_callback.filepath = self.checkpoint_path = os.path.join(folder, name)
            chosen.append(checkpoint_callback)
        if chosen:
            self.callbacks = keras.callbacks.CallbackList(chosen, model=self.model, add_history=False,
                                                          add_progbar=False)
            self.callbacks.set_params({"epochs": spec.config.epochs, "verbose": 0, "steps": None})

    def _local_dir(self, store: Any, remote: str) -> str:
        """A local folder for ``remote`` in the store: itself on a local store, else a temporary one uploaded later."""
        if store.is_local:
            os.makedirs(remote, exist_ok=True)
            return remote
        local = tempfile.mkdtemp(prefix="hora-keras-")
        self.uploads.append((local, store, remote))
        return local

    def on_train_begin(self) -> None:
        if self.callbacks is not None:
            self.model.stop_training = False
            self.callbacks.on_train_begin()

    def on_epoch_begin(self, epoch: int) -> None:
        if self.callbacks is not None:
            self.callbacks.on_epoch_begin(epoch)

    def on_batch_end(self, step: int, loss: float) -> None:
        if self.callbacks is not None:
            self.callbacks.on_train_batch_end(step, {"loss": loss})

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> bool:
        if self.callbacks is None:
            return False
        self.callbacks.on_epoch_end(epoch, {k: v for k, v in logs.items() if k != "epoch_time_s"})
        self._upload()
        return bool(getattr(self.model, "stop_training", False))

    def on_train_end(self, history: list[dict[str, float]]) -> None:
        if self.callbacks is None:
            return
        self.callbacks.on_train_end()
        self._upload()
        path = self.checkpoint_path
        if path and os.path.exists(path):  # the model checkpoint_callback saved last is the result
            if path.endswith(".weights.h5"):
                self.model.load_weights(path)
            else:
                with open(path, "rb") as fh:
                    self.final_model = fh.read()

    def _upload(self) -> None:
        """Copy what the callbacks wrote locally to the (remote) store."""
        for local, store, remote in self.uploads:
            for root, _, files in os.walk(local):
                for name in files:
                    rel = os.path.relpath(os.path.join(root, name), local)
                    with open(os.path.join(root, name), "rb") as fh:
                        store.write_bytes(remote + "/" + rel.replace(os.sep, "/"), fh.read())

    # batches ----------------------------------------------------------------------------
    def batches(self, reader: Any, transform: Any) -> Iterator[tuple]:
        """One pass of ``reader`` through :func:`hora.store.tf_adapter.make_tf_dataset`: ``(x, y[, w])`` tensors.

        ``transform`` runs on the numpy batches inside the adapter; the tensors are then
        shaped for the model by a ``tf.data`` map (float features to float32, the
        ``input_shapes`` reshapes, labels aligned to the outputs, weights to a float32
        vector) and prefetched with ``tf.data.AUTOTUNE``. Exactly ``len(reader)`` batches.

        Raises:
            ConfigError: a label that cannot meet its output, a failing ``transform``.
            DataError: a feature whose rows cannot take its ``input_shapes`` entry; reading failed.
        """
        import tensorflow as tf

        from hora.store.tf_adapter import make_tf_dataset

        ds = make_tf_dataset(reader, x_cols=list(self.feature_keys), y_cols=list(self.label_cols),
                             sample_weight_col=self.sample_weight_col, transform=transform)
        convert = self._tf_converter(ds.element_spec)
        ds = ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)
        return self._iterate(reader, ds)

    def _tf_converter(self, element_spec: Any) -> Any:
        """The ``tf.data`` map turning the adapter's ``(x, y[, w])`` into the model's inputs, planned from the static spec."""
        import tensorflow as tf

        parts = list(element_spec) if isinstance(element_spec, tuple) else [element_spec]
        fcols, lcols = list(self.feature_keys), list(self.label_cols)

        def split(spec: Any, cols: list) -> list:
            return [spec] if len(cols) == 1 else [spec[c] for c in cols]

        def row_of(spec: Any) -> tuple:
            return tuple(int(d) for d in spec.shape[1:])

        x_plan = []
        for i, (name, spec) in enumerate(zip(fcols, split(parts[0], fcols))):
            cast = tf.float32 if (spec.dtype.is_floating and spec.dtype != tf.float32) or spec.dtype == tf.bool else None
            shape = None
            if self.input_shapes is not None:
                shape = [int(d) for d in self.input_shapes[i]]
                if shape and shape[0] == -1 and all(d >= 0 for d in shape[1:]) and \
                        int(np.prod(shape[1:])) != int(np.prod(row_of(spec))):
                    raise DataError(f"feature {name!r} with per-row shape {row_of(spec)} cannot be reshaped to "
                                    f"input_shapes[{i}]={shape}")
            x_plan.append((cast, shape))
        y_plan = []
        for i, (name, spec) in enumerate(zip(lcols, split(parts[1], lcols) if lcols else [])):
            target = None
            if i < len(self.output_shapes):
                kind = np.dtype(spec.dtype.as_numpy_dtype).kind
                target = label_target(row_of(spec), kind, tuple(self.output_shapes[i]), name)
            y_plan.append(target)
        weighted = self.sample_weight_col is not None

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
            ys = [t if target is None else tf.reshape(t, [-1, *target])
                  for t, target in zip([batch[1]] if len(lcols) == 1 else [batch[1][c] for c in lcols], y_plan)]
            out = (one_or_tuple(xs), one_or_tuple(ys))
            if weighted:
                out += (tf.reshape(tf.cast(batch[2], tf.float32), [-1]),)
            return out

        return convert

    def _iterate(self, reader: Any, ds: Any) -> Iterator[tuple]:
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
                    f"rank {self.rank}: preparing a {reader.split!r} batch for the Keras model failed: "
                    f"{type(exc).__name__}: {exc.message}"
                ) from exc
            yield batch

    def _xy(self, batch: dict[str, np.ndarray]) -> tuple[Any, Any, Any]:
        x = to_inputs([batch[c] for c in self.feature_keys], self.input_shapes)
        labels = []
        for i, name in enumerate(self.label_cols):
            label = stack(batch[name])
            if i < len(self.output_shapes):
                label = align_label(label, self.output_shapes[i], name)
            labels.append(label)
        w = np.asarray(batch[self.sample_weight_col], dtype=np.float32).reshape(-1) if self.sample_weight_col else None
        return x, labels[0] if len(labels) == 1 else labels, w

    def _unpack(self, batch: Any) -> tuple[Any, Any, Any]:
        """``(x, y, w)`` for Keras from a :meth:`batches` item (or a numpy batch dict)."""
        if isinstance(batch, dict):
            return self._xy(batch)
        x, y = batch[0], batch[1]
        w = batch[2] if len(batch) > 2 else None
        return (list(x) if isinstance(x, tuple) else x), (list(y) if isinstance(y, tuple) else y), w

    def _probe_metric_keys(self, spec: Any) -> list[str]:
        """The names evaluation returns, from one all-zeros row (builds the compiled metrics on every rank)."""
        cols = spec.dataset.columns
        names = (*spec.features.columns, *self.label_cols, *([self.sample_weight_col] if self.sample_weight_col else []))
        batch = spec.features.stack({c: np.zeros((1, *cols[c].shape), dtype=cols[c].dtype) for c in names})
        if self.sample_weight_col:
            batch[self.sample_weight_col] = np.ones((1,), dtype=np.float32)
        if not self.output_shapes:
            outs = outputs_list(self.model(to_inputs([batch[c] for c in self.feature_keys], self.input_shapes)))
            self.output_shapes = [tuple(int(d) for d in o.shape[1:]) for o in outs]
        x, y, w = self._xy(batch)
        self.model.reset_metrics()
        logs = self.model.test_on_batch(x, y, sample_weight=w, return_dict=True)
        self.model.reset_metrics()
        return sorted(k for k in logs if k != "loss")

    # training -------------------------------------------------------------------------------
    def train_step(self, batch: Any, step: int) -> float:
        """One ``train_on_batch`` on a :meth:`batches` item ``(x, y[, w])``; returns this batch's loss.

        Raises:
            DataError: the loss is not finite (names the step and the rank).
        """
        x, y, w = self._unpack(batch)
        self.model.reset_metrics()  # the returned loss is this batch's, not a running mean
        logs = self.model.train_on_batch(x, y, sample_weight=w, return_dict=True)
        value = float(logs["loss"])
        if not math.isfinite(value):
            raise DataError(f"training loss became {value} at step {step} on rank {self.rank}")
        return value

    def eval_keys(self) -> list[str]:
        return ["loss", "_n", *self.metric_keys]

    def eval_batch(self, batch: Any) -> dict[str, float]:
        """``test_on_batch`` on a :meth:`batches` item; loss and metrics as sums over its rows."""
        x, y, w = self._unpack(batch)
        first = y[0] if isinstance(y, list) else y
        n = int(first.shape[0])
        self.model.reset_metrics()
        logs = self.model.test_on_batch(x, y, sample_weight=w, return_dict=True)
        out = {"loss": float(logs["loss"]) * n, "_n": float(n)}
        for key in self.metric_keys:
            out[key] = float(np.mean(np.asarray(logs[key]))) * n
        return out

    # state --------------------------------------------------------------------------------
    def broadcast_initial(self) -> None:
        self.hvd.broadcast_variables(self.model.variables, root_rank=0)
        self.hvd.broadcast_variables(self.optimizer.variables, root_rank=0)

    def rescale_learning_rate(self, factor: float) -> None:
        lr = getattr(self.optimizer, "learning_rate", None)
        try:
            value = float(np.asarray(lr))
        except (TypeError, ValueError):  # a schedule: lr_scaling="linear" refuses those at open
            return
        self.optimizer.learning_rate = value * factor

    def checkpoint(self, resume: Resume) -> bytes:
        return pickle.dumps({"model": model_to_bytes(self.model), "extra": resume.to_meta()},
                            protocol=pickle.HIGHEST_PROTOCOL)

    def restore(self, data: bytes, ckpt_epoch: int) -> Resume:
        ckpt = pickle.loads(data)
        saved = model_from_bytes(ckpt["model"], self.custom_objects, compile=True)
        self.model.set_weights(saved.get_weights())
        saved_opt = getattr(saved, "optimizer", None)
        if saved_opt is not None and getattr(saved_opt, "built", False):
            mine, theirs = self.optimizer.variables, saved_opt.variables
            if len(mine) == len(theirs) and all(tuple(a.shape) == tuple(b.shape) for a, b in zip(mine, theirs)):
                for a, b in zip(mine, theirs):
                    a.assign(b)
            else:
                logger.warning("the checkpoint's optimizer state does not match this optimizer; it starts fresh")
        self.final_model = None
        return Resume.from_meta(dict(ckpt.get("extra", {})), ckpt_epoch)

    def weights(self) -> bytes:
        return self.final_model if self.final_model is not None else model_to_bytes(self.model)

    def model_files(self) -> dict[str, bytes]:
        model = model_from_bytes(self.final_model, self.custom_objects) if self.final_model is not None else self.model
        set_custom_objects(model, self.custom_objects)
        return self.codec.serialize(model)

    def close(self) -> None:
        for local, _, _ in self.uploads:
            shutil.rmtree(local, ignore_errors=True)


__all__ = ["KerasSession"]
