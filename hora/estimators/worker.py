"""The training worker: one module-level function run on every rank with the frozen spec.

:func:`train_worker` is framework-neutral: tensors are the business of
``spec.trainer`` (see :class:`hora.estimators.trainer.Trainer`). Per rank it

1. sets up the framework (collectives, model, optimizer) from the spec,
2. resumes from the run's last checkpoint in the store when there is one,
3. broadcasts rank 0's model and optimizer state to every rank,
4. per epoch: trains on this rank's batches from :func:`hora.store.make_reader`
   (the same number of batches on every rank), each reader pass turned into the
   framework's batches by the trainer's ``batches`` hook (numpy dicts for torch, the
   ``tf.data`` adapter for Keras; ``transformation_fn`` applied first), validates,
   averages the epoch metrics across ranks, runs the callbacks, and on rank 0 checkpoints (model, optimizer,
   epoch, history) atomically, writes TensorBoard scalars and reports progress,
5. returns (rank 0) the history and the final weights.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
import types
from typing import Any, Iterator

import numpy as np

from hora.errors import ConfigError, DataError
from hora.estimators.callbacks import CallbackContext
from hora.estimators.spec import TrainSpec, thaw

logger = logging.getLogger(__name__)

#: Training steps between two progress reports (env ``HORA_REPORT_EVERY``).
REPORT_EVERY_ENV = "HORA_REPORT_EVERY"


def _report(**metrics: Any) -> None:
    """Send metrics to the driver's progress bar (a no-op outside a hora runner)."""
    try:
        from hora.runners import report
    except ImportError:  # runners not importable: nothing to report to
        return
    try:
        report(**metrics)
    except Exception as exc:  # progress must never kill training
        logger.debug("progress report failed: %s", exc)


class _TensorBoard:
    """Rank 0's TensorBoard writer; event files land in the store's ``runs/<run_id>/logs``."""

    def __init__(self, spec: TrainSpec) -> None:
        self.writer = None
        self.store = spec.store
        self.remote_dir = spec.store.layout.logs_dir(spec.run_id)
        self.local_dir: str | None = None
        self._tmp: str | None = None
        if "tensorflow" not in sys.modules:
            # tensorboard imports all of TensorFlow (seconds, GBs) to write event files
            # unless told to use its stub: the stub writes the same files
            sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception as exc:  # tensorboard package missing
            logger.warning("TensorBoard logging is off (torch.utils.tensorboard unavailable: %s)", exc)
            return
        if spec.store.is_local:
            self.local_dir = self.remote_dir
            os.makedirs(self.local_dir, exist_ok=True)
        else:
            self._tmp = tempfile.mkdtemp(prefix="hora-tb-")
            self.local_dir = self._tmp
        self.writer = SummaryWriter(log_dir=self.local_dir)

    def log(self, epoch: int, logs: dict[str, float]) -> None:
        if self.writer is None:
            return
        for key, value in logs.items():
            self.writer.add_scalar(key, value, epoch)
        self.writer.flush()
        if self._tmp is not None:  # upload the event files to a remote store
            for name in os.listdir(self._tmp):
                with open(os.path.join(self._tmp, name), "rb") as fh:
                    self.store.write_bytes(self.remote_dir + "/" + name, fh.read())

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


def _batches(
    spec: TrainSpec, trainer: Any, state: Any, transform: Any, split: str, rank: int, size: int, epoch: int,
    steps: int | None,
) -> Iterator[Any]:
    """This rank's batches of ``split`` for ``epoch``, as the trainer's :meth:`~Trainer.batches` hook
    makes them from each reader pass; with ``steps`` larger than one pass, further passes
    (differently shuffled) follow until ``steps`` batches were given.

    Raises:
        DataError: the hook gave a different number of batches than the reader holds
            (ranks would fall out of step in their collectives).
    """
    from hora.store import make_reader

    train = split == "train"
    batch_size = spec.batch_size if train else spec.val_batch_size
    given = 0
    sub = 0
    while True:
        reader = make_reader(
            spec.store,
            spec.dataset,
            split=split,
            rank=rank,
            size=size,
            batch_size=batch_size,
            epoch=epoch * 1000 + sub,
            seed=spec.seed,
            shuffle=spec.shuffle and train,
            shuffle_buffer_size=spec.shuffle_buffer_size,
        )
        expected = len(reader)
        if expected == 0:
            return
        in_pass = 0
        for batch in trainer.batches(state, reader, transform):
            if steps is not None and given >= steps:
                return
            in_pass += 1
            if in_pass > expected:
                break
            yield batch
            given += 1
        if in_pass != expected:
            got = f"more than {expected}" if in_pass > expected else str(in_pass)
            raise DataError(
                f"rank {rank}: {type(trainer).__name__}.batches gave {got} batches for one pass of the {split!r} "
                f"reader, which holds {expected} (every rank must step the same number of times)"
            )
        sub += 1
        if steps is None or given >= steps or not train:
            return


def train_worker(spec: TrainSpec) -> dict[str, Any] | None:
    """Train one rank; rank 0 returns ``{"history", "weights", "run_id", "epochs_run", ...}``, others None.

    Raises:
        ConfigError, DataError: bad data met on the worker (e.g. a label shape, NaN loss).
        StoreError: checkpoints cannot be written or read.
        CollectiveError: a collective failed (another rank died).
    """
    trainer = spec.trainer
    common = thaw(spec.common) if spec.common else {}
    callbacks = list(common.get("callbacks") or [])
    transformation_fn = common.get("transformation_fn")
    state = trainer.setup(spec)
    try:
        rank, size = trainer.rank(state), trainer.size(state)
        if size != spec.num_proc:
            logger.warning("the job has %d ranks, the estimator asked for num_proc=%d", size, spec.num_proc)
        history: list[dict[str, float]] = []
        start_epoch = 0
        if spec.resume:
            latest = spec.store.latest_checkpoint(spec.run_id)
            if latest is not None:
                ckpt_epoch, data = latest
                extra = trainer.load_state(state, data)
                history = list(extra.get("history", []))
                start_epoch = int(extra.get("epoch", ckpt_epoch)) + 1
                if rank == 0:
                    logger.info("run %s: resuming from the checkpoint of epoch %d", spec.run_id, ckpt_epoch)
        trainer.broadcast_initial(state)

        ctx = CallbackContext(rank=rank, size=size, run_id=spec.run_id, store=spec.store)
        ctx.state_bytes = lambda: trainer.state_bytes(state, {})
        tb = _TensorBoard(spec) if rank == 0 else None
        report_every = int(os.environ.get(REPORT_EVERY_ENV, spec.report_every))
        for cb in callbacks:
            cb.on_train_begin(ctx)
        epoch = start_epoch
        try:
            for epoch in range(start_epoch, spec.epochs):
                ctx.epoch = epoch
                for cb in callbacks:
                    cb.on_epoch_begin(ctx, epoch)
                t0 = time.monotonic()
                trainer.set_train(state, True)
                loss_sum, steps = 0.0, 0
                train_batches = _batches(spec, trainer, state, transformation_fn, "train", rank, size, epoch,
                                         spec.train_steps_per_epoch)
                for step, batch in enumerate(train_batches):
                    loss = trainer.train_step(state, batch, step)
                    loss_sum += loss
                    steps += 1
                    ctx.step = step
                    for cb in callbacks:
                        cb.on_batch_end(ctx, step, {"loss": loss})
                    if rank == 0 and spec.verbose and step % report_every == 0:
                        _report(epoch=epoch + 1, epochs=spec.epochs, step=step + 1, loss=round(loss, 6))
                trainer.finish_epoch(state, steps)
                logs = _epoch_logs(spec, trainer, state, rank, size, epoch, loss_sum, steps, transformation_fn)
                logs["epoch_time_s"] = time.monotonic() - t0
                for cb in callbacks:
                    cb.on_epoch_end(ctx, epoch, logs)
                stop = trainer.allreduce_sum(state, np.array([1.0 if ctx.stop_training else 0.0]))[0] > 0
                history.append({"epoch": epoch, **logs})
                if rank == 0:
                    spec.store.save_checkpoint(
                        spec.run_id, epoch, trainer.state_bytes(state, {"epoch": epoch, "history": history})
                    )
                    spec.store.write_json(spec.store.layout.history_path(spec.run_id), history)
                    if tb is not None:
                        tb.log(epoch, logs)
                    if spec.verbose:
                        shown = {k: round(v, 6) for k, v in logs.items() if k != "epoch_time_s"}
                        _report(epoch=epoch + 1, epochs=spec.epochs, step=steps, **shown)
                        logger.info("epoch %d/%d: %s", epoch + 1, spec.epochs, shown)
                if stop:
                    break
            for cb in callbacks:
                cb.on_train_end(ctx, history)
            restore = ctx.extra.get("restore_state")
            if restore is not None:
                trainer.load_state(state, restore)
        finally:
            if tb is not None:
                tb.close()
        if rank != 0:
            return None
        return {
            "history": history,
            "weights": trainer.weights_bytes(state),
            "run_id": spec.run_id,
            "start_epoch": start_epoch,
            "stopped_early": bool(history) and history[-1]["epoch"] < spec.epochs - 1,
            "restored_epoch": ctx.extra.get("restored_epoch"),
            "size": size,
        }
    finally:
        trainer.teardown(state)


def _epoch_logs(spec, trainer, state, rank, size, epoch, loss_sum, steps, transformation_fn) -> dict[str, float]:
    """Training loss and validation metrics of the epoch, averaged across ranks."""
    sums: dict[str, float] = {}
    if spec.has_val:
        trainer.set_train(state, False)
        for batch in _batches(spec, trainer, state, transformation_fn, "val", rank, size, epoch,
                              spec.validation_steps_per_epoch):
            for key, value in trainer.eval_batch(state, batch).items():
                sums[key] = sums.get(key, 0.0) + value
        for key, value in trainer.eval_finish(state).items():
            sums[key] = sums.get(key, 0.0) + value
        trainer.set_train(state, True)
    # every rank allreduces the same keys in the same order, even one without val batches
    keys = sorted(trainer.eval_keys(state)) if spec.has_val else []
    unknown = set(sums) - set(keys)
    if unknown:
        raise ConfigError(f"the trainer returned evaluation keys {sorted(unknown)} missing from its eval_keys()")
    vec = np.array([loss_sum, float(steps)] + [sums.get(k, 0.0) for k in keys], dtype=np.float64)
    total = trainer.allreduce_sum(state, vec)
    logs = {"loss": float(total[0] / max(total[1], 1.0))}
    if spec.has_val:
        val = dict(zip(keys, total[2:]))
        n = max(val.pop("_n"), 1.0)
        for key, value in val.items():
            logs[f"val_{key}"] = float(value / n)
    return logs


__all__ = ["train_worker"]
