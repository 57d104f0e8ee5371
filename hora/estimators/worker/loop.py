"""The training worker: one module-level function run on every rank with the frozen spec.

:func:`train_worker` is framework-neutral: tensors are the business of the framework's
:class:`~hora.estimators.framework.TrainingSession`. Per rank it

1. opens the session from the spec (collectives, model, optimizer),
2. resumes from the run's last checkpoint in the store when there is one (at its epoch
   and step, with its history and step count; a relaunch after a lost rank does the same,
   at the size the job has now),
3. broadcasts rank 0's model and optimizer state to every rank,
4. per epoch: trains on this rank's batches from :func:`hora.store.make_reader` (the
   same number on every rank; kept in memory after the first epoch with
   ``inmemory_cache_all``), each reader pass turned into the framework's batches by
   the session's ``batches`` hook (``transformation_fn`` and the feature groups
   applied first), validates, averages the epoch metrics across ranks (the one metric
   allreduce, :func:`allreduce_sum`), runs the callbacks, and on rank 0 checkpoints
   atomically (``checkpoint_every`` epochs, or every N steps mid-epoch), records the
   epoch (with its attempt and number of ranks) in the history, writes TensorBoard
   scalars and reports progress (a bar per epoch),
5. returns (rank 0) the history and the final weights.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import types
from typing import Any, Callable, Iterator

import numpy as np

from hora import settings
from hora.errors import ConfigError
from hora.estimators.worker.batches import CachedReader, rank_batches, steps_per_epoch
from hora.estimators.callbacks import CallbackContext
from hora.estimators.worker.feed import WARN_ABOVE, DataWait, advice, gathered
from hora.estimators.framework import Resume, TrainingSession
from hora.estimators.params import checkpoint_interval
from hora.estimators.spec import TrainSpec, thaw
from hora.runners.spec import ENV_ATTEMPT

logger = logging.getLogger(__name__)

#: Training steps between two progress reports (env ``HORA_REPORT_EVERY``).
ENV_REPORT_EVERY = "HORA_REPORT_EVERY"


#: Finished epochs repeated in each progress report (the driver polls only the latest report).
EPOCHS_DONE_KEPT = 8


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


#: Seconds the first TensorBoard log waits for the writer being made in the background.
TENSORBOARD_OPEN_TIMEOUT = 120.0


class _TensorBoard:
    """Rank 0's TensorBoard writer; event files land in the store's ``runs/<run_id>/logs``.

    The writer is made in a background thread (importing TensorBoard takes about 0.3 s,
    boto3 included): the other ranks would otherwise wait that long for rank 0 at the first
    broadcast. :meth:`log` waits for it.
    """

    def __init__(self, spec: TrainSpec) -> None:
        self.writer = None
        self.store = spec.store
        self.remote_dir = spec.store.layout.logs_dir(spec.run_id)
        self._tmp: str | None = None
        self._error: BaseException | None = None
        self._opening = threading.Thread(target=self._open_guarded, name="hora-tensorboard-open", daemon=True)
        self._opening.start()

    def _open_guarded(self) -> None:
        try:
            self._open()
        except BaseException as exc:  # raised where the writer is used, in the training thread
            self._error = exc

    def _ready(self) -> None:
        if self._opening.is_alive():
            self._opening.join(timeout=TENSORBOARD_OPEN_TIMEOUT)
            if self._opening.is_alive():
                logger.warning("TensorBoard logging is off: its writer was not ready within %.0f s",
                               TENSORBOARD_OPEN_TIMEOUT)
                self._error = None
                return
        if self._error is not None:
            exc, self._error = self._error, None
            raise exc

    def _open(self) -> None:
        if "tensorflow" not in sys.modules:
            # tensorboard imports all of TensorFlow (seconds, GBs) to write event files
            # unless told to use its stub: the stub writes the same files
            sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception as exc:  # tensorboard package missing
            logger.warning("TensorBoard logging is off (torch.utils.tensorboard unavailable: %s)", exc)
            return
        if self.store.is_local:
            local_dir = self.remote_dir
            os.makedirs(local_dir, exist_ok=True)
        else:
            self._tmp = local_dir = tempfile.mkdtemp(prefix="hora-tb-")
        self.writer = SummaryWriter(log_dir=local_dir)

    def log(self, epoch: int, logs: dict[str, float]) -> None:
        self._ready()
        if self.writer is None or self._opening.is_alive():
            return
        for key, value in logs.items():
            self.writer.add_scalar(key, value, epoch)
        self.writer.flush()
        if self._tmp is not None:  # upload the event files to a remote store
            for name in os.listdir(self._tmp):
                with open(os.path.join(self._tmp, name), "rb") as fh:
                    self.store.write_bytes(self.remote_dir + "/" + name, fh.read())

    def close(self) -> None:
        self._opening.join(timeout=TENSORBOARD_OPEN_TIMEOUT)
        if self.writer is not None:
            self.writer.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


def _transform(spec: TrainSpec, transformation_fn: Callable | None) -> Callable | None:
    """``transformation_fn`` followed by the stacking of feature groups (None when neither
    applies; without a ``transformation_fn`` the reader stacks the groups itself, once per
    row group instead of per batch)."""
    features = spec.features
    if not features.groups or transformation_fn is None:
        return transformation_fn
    return lambda batch: features.stack(transformation_fn(batch))


def _startup_phases() -> dict[str, float]:
    """This process's start and the runner's start-up stamps (``hora.runners.rank.main.PHASES``), wall clock."""
    out: dict[str, float] = {}
    try:
        import psutil

        out["process_start"] = psutil.Process().create_time()
    except Exception:  # psutil missing or /proc unreadable: the start is unknown
        pass
    try:
        from hora.runners.rank.main import PHASES
    except ImportError:
        return out
    return {**out, **PHASES}


def session_objects(session: TrainingSession) -> tuple[Any, Any]:
    """``(model, optimizer)`` a session trains, for the callbacks' context (None where it has none yet:
    a Lightning module's optimizer exists once its Trainer has configured it)."""
    model = getattr(session, "model", None)
    if model is None:
        model = getattr(session, "module", None)
    optimizer = getattr(session, "optimizer", None)
    return model, optimizer


def train_worker(spec: TrainSpec) -> dict[str, Any] | None:
    """Train one rank; rank 0 returns ``{"history", "weights", "run_id", "start_epoch", ...}``, others None.

    Raises:
        ConfigError, DataError: bad data met on the worker (e.g. a label shape, NaN loss).
        StoreError: checkpoints cannot be written or read.
        CollectiveError: a collective failed (another rank died).
    """
    entered = time.time()
    common = thaw(spec.common) if spec.common else {}
    from hora.native import state

    # Under hora's launchers the rank's main initializes the job and shuts it down; a Horovod Backend
    # calls this function in processes of its own, which may run the next job's function: the job
    # this function initialized (the session's init) ends with it.
    owns_job = not state.is_initialized()
    session = spec.framework.session.open(spec)
    try:
        run = WorkerRun(spec, session, list(common.get("callbacks") or []),
                        _transform(spec, common.get("transformation_fn")))
        run.phases.update(_startup_phases(), fn_entered=entered, session_open=time.time())
        try:
            if session.drives_loop:  # the framework's own loop (Lightning) through the run's hooks
                return session.fit_run(run)
            return _train(run)
        finally:
            run.close()
    finally:
        session.close()
        if owns_job and state.is_initialized():
            state.shutdown()


class WorkerRun:
    """One rank's run around a session: data, callbacks, checkpoints, history, TensorBoard, progress.

    The shared loop (:func:`_train`) and frameworks that drive their own loop
    (``TrainingSession.drives_loop``, e.g. Lightning) both go through these methods, so
    checkpoints, callbacks and reports behave the same for every framework.
    """

    def __init__(self, spec: TrainSpec, session: TrainingSession, callbacks: list, transform: Callable | None) -> None:
        self.spec, self.session, self.callbacks, self.transform = spec, session, callbacks, transform
        #: the reader stacks the feature groups (no transformation_fn needs to see their members)
        self.stack_groups = bool(spec.features.groups) and transform is None
        self.config = spec.config
        self.rank, self.size = session.rank, session.size
        if self.size != spec.num_proc:
            logger.warning("the job has %d ranks, the estimator asked for num_proc=%d", self.size, spec.num_proc)
        self.history: list[dict[str, float]] = []
        self.attempt = int(os.environ.get(ENV_ATTEMPT, "1") or 1)  # set by hora.runners (relaunches count up)
        self.every, self.every_unit = checkpoint_interval(self.config.checkpoint_every)
        self.resumed_at: int | None = None  # the epoch (0-based) this attempt resumed at, if it resumed
        self.ctx = CallbackContext(rank=self.rank, size=self.size, run_id=spec.run_id, store=spec.store,
                                   params=self.config.json_values())
        session.checkpoint_location = (spec.store, spec.run_id, self.attempt)
        self.ctx.state_bytes = lambda: session.checkpoint(self.where(session.epoch, 0))
        self.ctx.model_files = session.model_files
        self.ctx.model, self.ctx.optimizer = session_objects(session)
        if getattr(session, "scheduler", None) is not None:
            self.ctx.extra["lr_scheduler"] = session.scheduler
        self.tb = _TensorBoard(spec) if self.rank == 0 else None
        every = settings.get(ENV_REPORT_EVERY)
        self.report_every = int(spec.report_every if every is None else every)
        self.cache: dict[str, CachedReader] | None = {} if self.config.inmemory_cache_all else None
        self.total = steps_per_epoch(spec, "train", self.rank, self.size) if spec.dataset is not None else None
        self.last_epoch: dict[str, float] = {}  # repeated in the next epoch's reports (the driver keeps the latest)
        self.epochs_done: list[dict[str, float]] = []  # the last epochs' shown metrics, in every report
        self.start_epoch = 0
        #: wall-clock times of this rank's phases (``time.time()``), in rank 0's result as ``phases``;
        #: each epoch's entry has a ``profile``: steps, seconds waiting for batches and in
        #: train_step, and the session's own split of train_step (``step_seconds``) when it keeps one
        self.phases: dict[str, Any] = {"epochs": []}
        #: this rank's data-wait clock (:mod:`hora.estimators.worker.feed`); every rank's fraction per epoch
        self.feed = DataWait()
        self.data_wait_by_rank: list[dict[str, Any]] = []
        self._warned_wait = False

    def where(self, epoch: int, step: int) -> Resume:
        """Where training stands after ``step`` batches of ``epoch`` (0: the epoch is done), for a checkpoint."""
        return Resume(epoch=epoch, step=step, global_step=self.session.global_step, history=list(self.history),
                      size=self.size)

    def resumed(self, resume: Resume) -> Resume:
        """``resume`` as this job continues it: with another number of ranks than wrote the
        checkpoint, the learning rate follows the size (``lr_scaling="linear"``) and a
        mid-epoch step is converted to about as many rows (the reader re-shards)."""
        if resume.epoch or resume.step or resume.history:
            self.resumed_at = resume.epoch
            if self.rank == 0:
                logger.warning("run %s: attempt %d, resumed at epoch %d step %d on %d rank(s)%s", self.spec.run_id,
                               self.attempt, resume.epoch + 1, resume.step, self.size,
                               f" (the checkpoint's run had {resume.size})" if resume.size not in (0, self.size) else "")
        if resume.size and resume.size != self.size:
            if self.config.lr_scaling == "linear":
                self.session.rescale_learning_rate(self.size / resume.size)
            if resume.step:
                total = self.steps("train") or 1
                resume.step = min(total - 1, int(round(resume.step * resume.size / self.size)))
        return resume

    def checkpoint_due(self, epoch: int, step: int | None = None) -> bool:
        """Whether rank 0 checkpoints after ``step`` (None: at the end of ``epoch``), per ``checkpoint_every``."""
        if step is None:  # every epoch-end with "N steps"; the last epoch always
            return self.every_unit == "steps" or (epoch + 1) % self.every == 0 or epoch == self.config.epochs - 1
        return (self.every_unit == "steps" and self.session.global_step % self.every == 0
                and step + 1 < (self.total or 0))

    def makes_checkpoints(self) -> bool:
        """Whether this rank calls the session's :meth:`checkpoint` when one is due: rank 0, which
        writes it, and every rank when it is a collective (a sharded optimizer's state)."""
        return self.rank == 0 or self.session.checkpoint_collective

    def save_step_checkpoint(self, epoch: int, step: int) -> None:
        """A mid-epoch checkpoint after ``step`` (``checkpoint_every="N steps"``), written by rank 0."""
        if self.makes_checkpoints() and self.checkpoint_due(epoch, step):
            data = self.session.checkpoint(self.where(epoch, step + 1))
            if self.rank == 0:
                self.spec.store.save_checkpoint(self.spec.run_id, epoch, data)

    # data ---------------------------------------------------------------------------------
    def latest_checkpoint(self) -> tuple[int, bytes] | None:
        """``(epoch, data)`` of this run's last checkpoint in the store (when resuming), else None."""
        latest = self.spec.store.latest_checkpoint(self.spec.run_id) if self.spec.resume else None
        if latest is not None and self.rank == 0:
            logger.info("run %s: resuming from the checkpoint of epoch %d", self.spec.run_id, latest[0])
        return latest

    def batches(self, split: str, epoch: int, skip: int = 0) -> Iterator[Any]:
        """This rank's batches of ``split`` for ``epoch``, as the session makes them."""
        steps = self.config.train_steps_per_epoch if split == "train" else self.config.validation_steps_per_epoch
        batches = rank_batches(self.spec, self.session, self.transform, split, self.rank, self.size, epoch, steps,
                               self.cache, skip, stack_groups=self.stack_groups)
        return self.feed.timed(batches, epoch) if split == "train" else batches

    def steps(self, split: str) -> int:
        """Batches of ``split`` per epoch on this rank (0 without that split)."""
        if self.spec.dataset is None or (split == "val" and not self.spec.has_val):
            return 0
        return steps_per_epoch(self.spec, split, self.rank, self.size)

    # hooks ---------------------------------------------------------------------------------
    def train_begin(self) -> None:
        for cb in self.callbacks:
            cb.on_train_begin(self.ctx)
        self.session.on_train_begin()

    def epoch_begin(self, epoch: int) -> None:
        self.session.epoch = self.ctx.epoch = epoch
        self.epoch_t0 = time.monotonic()
        self.feed.begin(epoch)
        for cb in self.callbacks:
            cb.on_epoch_begin(self.ctx, epoch)
        self.session.on_epoch_begin(epoch)

    def batch_end(self, epoch: int, step: int, loss: float | None) -> None:
        self.feed.step_ends()
        self.session.step = self.ctx.step = step
        if self.callbacks:
            logs = {"loss": loss} if loss is not None else {}
            for cb in self.callbacks:
                cb.on_batch_end(self.ctx, step, logs)
        if self.rank == 0 and self.config.verbose and step % self.report_every == 0:
            _report(epoch=epoch + 1, epochs=self.config.epochs, step=step + 1, total=self.total,
                    last_epoch=self.last_epoch, epochs_done=self.epochs_done, **self._resumed_metric(),
                    **self._rate_metrics(step + 1), data_wait=round(self.feed.fraction(), 3),
                    **({"loss": round(loss, 6)} if loss is not None else {}))

    def _rate_metrics(self, steps: int, seconds: float | None = None) -> dict[str, float]:
        """``elapsed_s`` (this epoch's seconds on this rank) and ``rows`` (all ranks' rows trained
        so far, from rank 0's steps): the driver's bar computes its rate from them."""
        if seconds is None:
            seconds = time.monotonic() - getattr(self, "epoch_t0", time.monotonic())
        out = {"elapsed_s": round(seconds, 3)}
        rows = getattr(self.spec.dataset, "train_rows", None)
        if self.total and isinstance(rows, int):
            out["rows"] = int(round(rows * min(steps, self.total) / self.total))
        return out

    def _resumed_metric(self) -> dict[str, int]:
        return {} if self.resumed_at is None else {"resumed_at": self.resumed_at + 1}

    def epoch_end(self, epoch: int, logs: dict[str, float], checkpoint: Callable[[], bytes | None]) -> bool:
        """Callbacks, history, and on rank 0 the checkpoint (``checkpoint()``), TensorBoard and the epoch's report.

        Every rank calls it (it gathers the ranks' data wait, :meth:`data_wait`). Returns whether
        a callback asked to stop (this rank's view; the caller agrees across ranks).
        """
        logs["data_wait"] = self.data_wait(epoch)
        for cb in self.callbacks:
            cb.on_epoch_end(self.ctx, epoch, logs)
        self.history.append({"epoch": epoch, **logs, "attempt": self.attempt, "num_proc": self.size})
        self.session.step = 0
        data = checkpoint() if self.makes_checkpoints() and self.checkpoint_due(epoch) else None
        if self.rank == 0:
            store = self.spec.store
            if data is not None:
                store.save_checkpoint(self.spec.run_id, epoch, data)
            store.write_json(store.layout.history_path(self.spec.run_id), self.history)
            if self.tb is not None:
                self.tb.log(epoch, logs)
            if self.config.verbose:
                shown = {k: round(v, 6) for k, v in logs.items() if k != "epoch_time_s"}
                rate = self._rate_metrics(self.total or 0, logs.get("epoch_time_s"))
                # final=True: these are the epoch's logged metrics, the last values its bar shows
                self.last_epoch = {**shown, **rate}
                # the driver sees only the latest report: the last epochs ride along so that none is lost
                self.epochs_done = [*self.epochs_done, {"epoch": epoch + 1, **self.last_epoch}][-EPOCHS_DONE_KEPT:]
                _report(epoch=epoch + 1, epochs=self.config.epochs, step=self.total, total=self.total,
                        epochs_done=self.epochs_done, **self._resumed_metric(), **shown, **rate, final=True)
                # the driver shows the epoch; the rank's own line is verbose=2 detail
                logger.log(logging.INFO if self.config.verbose >= 2 else logging.DEBUG,
                           "epoch %d/%d: %s", epoch + 1, self.config.epochs, shown)
        return self.ctx.stop_training

    def data_wait(self, epoch: int) -> float:
        """The epoch's data wait, the largest over the ranks (every rank's is kept for the result);
        after the first epoch over :data:`~hora.estimators.worker.feed.WARN_ABOVE`, rank 0 warns once."""
        ranks = gathered(self.feed.fraction(), self.rank, self.size)
        self.data_wait_by_rank.append({"epoch": epoch, "ranks": [round(v, 4) for v in ranks]})
        worst = max(ranks)
        if worst > WARN_ABOVE and not self._warned_wait and self.rank == 0:
            self._warned_wait = True
            logger.warning(advice(ranks, epoch, self._decoded_columns(), self.cache is not None,
                                  self.config.batch_size, bool(self.config.use_gpu), self.transform is not None))
        return worst

    def _decoded_columns(self) -> list[str]:
        """The feature columns the ranks decode (binary columns, through ``decode_fn`` or the image decoder)."""
        columns = getattr(self.spec.dataset, "columns", None) or {}
        decode_fn = (thaw(self.spec.common) if self.spec.common else {}).get("decode_fn") or {}
        return [c for c in self.spec.features.columns
                if c in columns and columns[c].kind == "binary" and decode_fn.get(c, True) is not None]

    def train_end(self) -> None:
        """The callbacks' ends, a best state restored (BestModelCheckpoint), then the result hooks."""
        self.session.on_train_end(self.history)
        for cb in self.callbacks:
            cb.on_train_end(self.ctx, self.history)
        restore = self.ctx.extra.get("restore_state")
        if restore is not None:
            self.session.restore(restore, int(self.ctx.extra.get("restored_epoch") or 0))
        self.session.finalize()
        for cb in self.callbacks:
            cb.on_train_result(self.ctx, self.history)

    def result(self) -> dict[str, Any] | None:
        """What rank 0 returns to the driver (None on the other ranks)."""
        if self.rank != 0:
            return None
        history = self.history
        return {
            "history": history,
            "weights": self.session.weights(),
            "run_id": self.spec.run_id,
            "start_epoch": self.start_epoch,
            "stopped_early": bool(history) and history[-1]["epoch"] < self.config.epochs - 1,
            "restored_epoch": self.ctx.extra.get("restored_epoch"),
            "size": self.size,
            "data_wait_by_rank": list(self.data_wait_by_rank),
            "phases": {**self.phases, "result": time.time()},
        }

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _train(run: WorkerRun) -> dict | None:
    """The shared epoch loop over a session."""
    session, config = run.session, run.config
    resume = Resume()
    latest = run.latest_checkpoint()
    if latest is not None:
        resume = run.resumed(session.restore(latest[1], latest[0]))
    run.history, run.start_epoch = list(resume.history), resume.epoch
    session.epoch, session.step, session.global_step = resume.epoch, resume.step, resume.global_step
    session.broadcast_initial()
    run.train_begin()
    run.phases["train_begin"] = time.time()
    for epoch in range(resume.epoch, config.epochs):
        run.epoch_begin(epoch)
        skip = resume.step if epoch == resume.epoch else 0
        t0 = time.monotonic()
        session.set_train(True)
        loss_sum, steps = 0.0, 0
        clock = time.perf_counter
        stepping = 0.0  # seconds in train_step (the epoch's profile; the wait for batches: run.feed)
        inner = getattr(session, "step_seconds", None)
        inner_before = dict(inner) if inner else {}
        # decided once per epoch: a session without its own on_batch_end is not called per step,
        # nor is save_step_checkpoint where no step checkpoint is due (not rank 0 unless collective, or by epochs)
        on_batch_end = session.on_batch_end
        if getattr(on_batch_end, "__func__", None) is TrainingSession.on_batch_end:
            on_batch_end = None
        step_checkpoints = run.makes_checkpoints() and run.every_unit == "steps"
        for step, batch in enumerate(run.batches("train", epoch, skip), start=skip):
            t_got = clock()
            session.step = step
            loss = session.train_step(batch, step)
            stepping += clock() - t_got
            session.global_step += 1
            loss_sum += loss
            steps += 1
            if on_batch_end is not None:
                on_batch_end(step, loss)
            run.batch_end(epoch, step, loss)
            if step_checkpoints:
                run.save_step_checkpoint(epoch, step)
        session.finish_epoch(steps)
        profile = {"steps": steps, "batch_wait": run.feed.waited, "first_batch_wait": run.feed.first,
                   "train_step": stepping,
                   **{f"train_step.{k}": v - inner_before.get(k, 0.0) for k, v in (inner or {}).items()}}
        logs = _epoch_logs(run, epoch, loss_sum, steps)
        logs["epoch_time_s"] = time.monotonic() - t0
        ended = time.time()
        native_stop = session.on_epoch_end(epoch, logs)
        wants_stop = run.epoch_end(epoch, logs, lambda: session.checkpoint(run.where(epoch, 0))) or native_stop
        run.phases["epochs"].append({"start": ended - logs["epoch_time_s"], "end": ended, "after": time.time(),
                                     "profile": profile})
        if allreduce_sum(np.array([1.0 if wants_stop else 0.0]))[0] > 0:
            break
    run.train_end()
    return run.result()


def _epoch_logs(run: WorkerRun, epoch: int, loss_sum: float, steps: int) -> dict[str, float]:
    """Training loss and validation metrics of the epoch, averaged across ranks (the one metric allreduce)."""
    spec, session = run.spec, run.session
    sums: dict[str, float] = {}
    if spec.has_val:
        session.set_train(False)
        for batch in run.batches("val", epoch):
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


__all__ = ["train_worker", "allreduce_sum", "WorkerRun", "CachedReader", "rank_batches"]
