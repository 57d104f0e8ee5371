"""Callbacks of the fault-tolerance tests (importable by Spark and Dask workers): real faults
injected as a user would, from a callback, and a probe of every rank's final weights."""

from __future__ import annotations

import hashlib
import os
import signal
import time

from hora.estimators.callbacks import Callback


class KillRank(Callback):
    """SIGKILL rank ``rank`` after batch ``step`` of epoch ``epoch`` in attempt ``attempt``
    (None: in every attempt) (its own process; ``target="worker"``: the Dask worker or Spark
    executor above it)."""

    def __init__(self, rank: int, epoch: int, step: int, attempt: int | None = 1, target: str = "rank",
                 mark_dir: str | None = None) -> None:
        self.rank, self.epoch, self.step, self.attempt, self.target = rank, epoch, step, attempt, target
        self.mark_dir = mark_dir

    def on_batch_end(self, ctx, step, logs):
        if (ctx.rank, ctx.epoch, step) != (self.rank, self.epoch, self.step):
            return
        if self.attempt is not None and os.environ.get("HORA_ATTEMPT") != str(self.attempt):
            return
        if self.mark_dir:  # tell the test this rank's pid and its supervisor's (a Dask worker), and wait for it
            with open(os.path.join(self.mark_dir, f"leaving.{self.attempt}.tmp"), "w") as fh:
                fh.write(f"{os.getpid()} {os.environ.get('HORA_SUPERVISOR_PID', '')}")
            os.replace(os.path.join(self.mark_dir, f"leaving.{self.attempt}.tmp"),
                       os.path.join(self.mark_dir, f"leaving.{self.attempt}"))
            time.sleep(300)
        victim = os.getpid()
        if self.target == "worker":
            victim = int(os.environ["HORA_SUPERVISOR_PID"])
        elif self.target == "executor":
            import psutil

            # from the rank's supervisor (its Spark task's Python worker): a rank forked by a
            # warm rank server has the server, not the executor, above it
            proc = psutil.Process(int(os.environ.get("HORA_SUPERVISOR_PID") or os.getpid()))
            while proc is not None and "CoarseGrainedExecutorBackend" not in " ".join(proc.cmdline()):
                proc = proc.parent()
            assert proc is not None, "no executor JVM above this rank's supervisor"
            victim = proc.pid
        os.kill(victim, signal.SIGKILL)
        time.sleep(300)


class WeightsProbe(Callback):
    """Each rank writes the sha256 of its final torch model's parameters and buffers (their
    values, in name order) to ``<folder>/weights.<rank>``."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_train_result(self, ctx, history):
        from hora.estimators.frameworks.torch.codec import TorchCodec

        model = TorchCodec().deserialize(ctx.model_files())
        digest = hashlib.sha256()
        for name, value in sorted(model.state_dict().items()):
            digest.update(name.encode())
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
        with open(os.path.join(self.folder, f"weights.{ctx.rank}"), "w") as fh:
            fh.write(digest.hexdigest())
