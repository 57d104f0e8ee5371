"""The training worker: one module-level function run on every rank with the frozen spec.

:func:`train_worker` is framework-neutral: tensors are the business of the framework's
:class:`~hora.estimators.framework.TrainingSession`. Per rank it

1. opens the session from the spec (collectives, model, optimizer),
2. resumes from the run's last checkpoint in the store when there is one (at its epoch
   and step, with its history and step count),
3. broadcasts rank 0's model and optimizer state to every rank,
4. per epoch: trains on this rank's batches from :func:`hora.store.make_reader` (the
   same number on every rank; kept in memory after the first epoch with
   ``inmemory_cache_all``), each reader pass turned into the framework's batches by
   the session's ``batches`` hook (``transformation_fn`` and the feature groups
   applied first), validates, averages the epoch metrics across ranks (the one metric
   allreduce, :func:`allreduce_sum`), runs the callbacks, and on rank 0 checkpoints
   atomically, writes TensorBoard scalars and reports progress (a bar per epoch),
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
from typing import Any, Callable, Iterator

import numpy as np

from hora.errors import ConfigError, DataError
from hora.estimators.callbacks import CallbackContext
from hora.estimators.framework import Resume, TrainingSession
from hora.estimators.spec import TrainSpec, thaw
from hora.store.reader import Reader

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


def allreduce_sum(values: np.ndarray) -> np.ndarray:
    """Sum a float64 vector across the ranks of the job (the estimators' only metric collective)."""
    import hora.native as hn

    arr = np.ascontiguousarray(values, dtype=np.float64)
    if hn.size() == 1:
        return arr.copy()
    return np.asarray(hn.allreduce(arr, op=hn.Sum, name="hora.estimators.metrics"), dtype=np.float64).copy()


class _TensorBoard:
    """Rank 0's TensorBoard writer; event files land in the store's ``runs/<run_id>/logs``."""

    def __init__(self, spec: TrainSpec) -> None:
        self.writer = None
        self.store = spec.store
        self.remote_dir = spec.store.layout.logs_dir(spec.run_id)
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
            local_dir = self.remote_dir
            os.makedirs(local_dir, exist_ok=True)
        else:
            self._tmp = local_dir = tempfile.mkdtemp(prefix="hora-tb-")
        self.writer = SummaryWriter(log_dir=local_dir)

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


class CachedReader(Reader):
    """A :class:`~hora.store.Reader` that keeps its rank's rows after the first pass (``inmemory_cache_all``).

    The first pass reads and keeps what the wrapped reader yields; later passes
    (:meth:`set_epoch` for the next epoch) serve the same rows from memory, in a new
    seeded order when shuffling, in as many batches as the first pass (the same on
    every rank, as the reader guarantees).
    """

    def __init__(self, reader: Reader) -> None:  # shares the reader's plan; reads nothing yet
        self.__dict__.update(reader.__dict__)
        self._source = reader
        self._cache: dict[str, np.ndarray] | None = None
        self._sizes: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if getattr(self, "_cache", None) is None and hasattr(self, "_source"):
            self._source.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self._sizes) if self._cache is not None else len(self._source)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self._cache is None:
            parts: list[dict[str, np.ndarray]] = []
            for batch in self._source:
                parts.append(batch)
                yield batch
            if len(parts) == len(self._source):  # a whole pass: keep it
                self._sizes = [len(next(iter(p.values()))) for p in parts]
                self._cache = {c: np.concatenate([p[c] for p in parts]) for c in parts[0]} if parts else {}
            return
        rows = sum(self._sizes)
        order = np.arange(rows)
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch, self.rank, 0xCA]).permutation(rows)
        start = 0
        for n in self._sizes:
            idx = order[start:start + n]
            start += n
            yield {c: a[idx] for c, a in self._cache.items()}


def _batches(
    spec: Any, session: TrainingSession, transform: Callable | None, split: str, rank: int, size: int, epoch: int,
    steps: int | None, cache: dict[str, CachedReader] | None = None, skip: int = 0,
) -> Iterator[Any]:
    """This rank's batches of ``split`` for ``epoch``, as the session's ``batches`` hook makes them
    from each reader pass; with ``steps`` larger than one pass, further passes (differently
    shuffled) follow until ``steps`` batches were given. ``cache`` (a dict kept across epochs)
    holds the in-memory readers; ``skip`` batches are passed over (a resumed epoch).

    Raises:
        DataError: the hook gave a different number of batches than the reader holds
            (ranks would fall out of step in their collectives).
    """
    from hora.store import make_reader

    config = spec.config
    train = split == "train"
    given = sub = 0
    while True:
        pass_epoch = epoch * 1000 + sub
        reader = cache.get(split) if cache is not None else None
        if reader is None:
            reader = make_reader(spec.store, spec.dataset, split=split, rank=rank, size=size,
                                 batch_size=config.batch_size if train else config.val_batch, epoch=pass_epoch,
                                 seed=config.seed, shuffle=config.shuffle and train,
                                 shuffle_buffer_size=config.shuffle_buffer_size)
            if cache is not None:
                reader = cache[split] = CachedReader(reader)
        else:
            reader.set_epoch(pass_epoch)
        expected = len(reader)
        if expected == 0:
            return
        in_pass = 0
        for batch in session.batches(reader, transform):
            if steps is not None and given >= steps:
                return
            in_pass += 1
            if in_pass > expected:
                break
            if given < skip:
                given += 1
                continue
            yield batch
            given += 1
        if in_pass != expected:
            got = f"more than {expected}" if in_pass > expected else str(in_pass)
            raise DataError(
                f"rank {rank}: {type(session).__name__}.batches gave {got} batches for one pass of the {split!r} "
                f"reader, which holds {expected} (every rank must step the same number of times)"
            )
        sub += 1
        if steps is None or given >= steps or not train:
            return


def _steps_per_epoch(spec: TrainSpec, rank: int, size: int) -> int:
    """Training batches of one epoch on this rank (the progress bar's total)."""
    from hora.store import make_reader

    config = spec.config
    one_pass = len(make_reader(spec.store, spec.dataset, split="train", rank=rank, size=size,
                               batch_size=config.batch_size, epoch=0, seed=config.seed, shuffle=False))
    return config.train_steps_per_epoch or one_pass


def _transform(spec: TrainSpec, transformation_fn: Callable | None) -> Callable | None:
    """``transformation_fn`` followed by the stacking of feature groups (None when neither applies)."""
    features = spec.features
    if not features.groups:
        return transformation_fn
    if transformation_fn is None:
        return features.stack
    return lambda batch: features.stack(transformation_fn(batch))


def train_worker(spec: TrainSpec) -> dict[str, Any] | None:
    """Train one rank; rank 0 returns ``{"history", "weights", "run_id", "start_epoch", ...}``, others None.

    Raises:
        ConfigError, DataError: bad data met on the worker (e.g. a label shape, NaN loss).
        StoreError: checkpoints cannot be written or read.
        CollectiveError: a collective failed (another rank died).
    """
    common = thaw(spec.common) if spec.common else {}
    callbacks = list(common.get("callbacks") or [])
    transform = _transform(spec, common.get("transformation_fn"))
    session = spec.framework.session.open(spec)
    try:
        return _train(spec, session, callbacks, transform)
    finally:
        session.close()


def _train(spec: TrainSpec, session: TrainingSession, callbacks: list, transform: Callable | None) -> dict | None:
    config = spec.config
    rank, size = session.rank, session.size
    if size != spec.num_proc:
        logger.warning("the job has %d ranks, the estimator asked for num_proc=%d", size, spec.num_proc)
    resume = Resume()
    if spec.resume:
        latest = spec.store.latest_checkpoint(spec.run_id)
        if latest is not None:
            resume = session.restore(latest[1], latest[0])
            if rank == 0:
                logger.info("run %s: resuming from the checkpoint of epoch %d", spec.run_id, latest[0])
    history = list(resume.history)
    session.epoch, session.step, session.global_step = resume.epoch, resume.step, resume.global_step
    session.broadcast_initial()

    ctx = CallbackContext(rank=rank, size=size, run_id=spec.run_id, store=spec.store, params=config.json_values())
    ctx.state_bytes = lambda: session.checkpoint(Resume(session.epoch, 0, session.global_step, list(history)))
    ctx.model_files = session.model_files
    tb = _TensorBoard(spec) if rank == 0 else None
    report_every = int(os.environ.get(REPORT_EVERY_ENV, spec.report_every))
    total = _steps_per_epoch(spec, rank, size)
    cache: dict[str, CachedReader] | None = {} if config.inmemory_cache_all else None
    last_epoch: dict[str, float] = {}  # shown again with the next epoch's reports (the driver keeps only the latest)
    for cb in callbacks:
        cb.on_train_begin(ctx)
    session.on_train_begin()
    try:
        for epoch in range(resume.epoch, config.epochs):
            session.epoch = ctx.epoch = epoch
            skip = resume.step if epoch == resume.epoch else 0
            for cb in callbacks:
                cb.on_epoch_begin(ctx, epoch)
            session.on_epoch_begin(epoch)
            t0 = time.monotonic()
            session.set_train(True)
            loss_sum, steps = 0.0, 0
            for step, batch in enumerate(_batches(spec, session, transform, "train", rank, size, epoch,
                                                  config.train_steps_per_epoch, cache, skip), start=skip):
                session.step = ctx.step = step
                loss = session.train_step(batch, step)
                session.global_step += 1
                loss_sum += loss
                steps += 1
                session.on_batch_end(step, loss)
                for cb in callbacks:
                    cb.on_batch_end(ctx, step, {"loss": loss})
                if rank == 0 and config.verbose and step % report_every == 0:
                    _report(epoch=epoch + 1, epochs=config.epochs, step=step + 1, total=total, loss=round(loss, 6),
                            last_epoch=last_epoch)
            session.finish_epoch(steps)
            logs = _epoch_logs(spec, session, rank, size, epoch, loss_sum, steps, transform, cache)
            logs["epoch_time_s"] = time.monotonic() - t0
            for cb in callbacks:
                cb.on_epoch_end(ctx, epoch, logs)
            wants_stop = session.on_epoch_end(epoch, logs) or ctx.stop_training
            stop = allreduce_sum(np.array([1.0 if wants_stop else 0.0]))[0] > 0
            history.append({"epoch": epoch, **logs})
            session.step = 0
            if rank == 0:
                resume_at = Resume(epoch=epoch, step=0, global_step=session.global_step, history=history)
                spec.store.save_checkpoint(spec.run_id, epoch, session.checkpoint(resume_at))
                spec.store.write_json(spec.store.layout.history_path(spec.run_id), history)
                if tb is not None:
                    tb.log(epoch, logs)
                if config.verbose:
                    shown = {k: round(v, 6) for k, v in logs.items() if k != "epoch_time_s"}
                    _report(epoch=epoch + 1, epochs=config.epochs, step=total, total=total, **shown)
                    last_epoch = shown
                    logger.info("epoch %d/%d: %s", epoch + 1, config.epochs, shown)
            if stop:
                break
        session.on_train_end(history)
        for cb in callbacks:
            cb.on_train_end(ctx, history)
        restore = ctx.extra.get("restore_state")
        if restore is not None:
            session.restore(restore, int(ctx.extra.get("restored_epoch") or 0))
        for cb in callbacks:
            cb.on_train_result(ctx, history)
    finally:
        if tb is not None:
            tb.close()
    if rank != 0:
        return None
    return {
        "history": history,
        "weights": session.weights(),
        "run_id": spec.run_id,
        "start_epoch": resume.epoch,
        "stopped_early": bool(history) and history[-1]["epoch"] < config.epochs - 1,
        "restored_epoch": ctx.extra.get("restored_epoch"),
        "size": size,
    }


def _epoch_logs(spec: TrainSpec, session: TrainingSession, rank: int, size: int, epoch: int, loss_sum: float,
                steps: int, transform: Callable | None, cache: dict | None) -> dict[str, float]:
    """Training loss and validation metrics of the epoch, averaged across ranks."""
    sums: dict[str, float] = {}
    if spec.has_val:
        session.set_train(False)
        for batch in _batches(spec, session, transform, "val", rank, size, epoch,
                              spec.config.validation_steps_per_epoch, cache):
            for key, value in session.eval_batch(batch).items():
                sums[key] = sums.get(key, 0.0) + value
        for key, value in session.eval_finish().items():
            sums[key] = sums.get(key, 0.0) + value
        session.set_train(True)
    # every rank allreduces the same keys in the same order, even one without val batches
    keys = sorted(session.eval_keys()) if spec.has_val else []
    unknown = set(sums) - set(keys)
    if unknown:
        raise ConfigError(f"the session returned evaluation keys {sorted(unknown)} missing from its eval_keys()")
    total = allreduce_sum(np.array([loss_sum, float(steps)] + [sums.get(k, 0.0) for k in keys], dtype=np.float64))
    logs = {"loss": float(total[0] / max(total[1], 1.0))}
    if spec.has_val:
        val = dict(zip(keys, total[2:]))
        n = max(val.pop("_n"), 1.0)
        for key, value in val.items():
            logs[f"val_{key}"] = float(value / n)
    return logs


__all__ = ["train_worker", "allreduce_sum", "CachedReader"]
