"""Spark backend: the ranks are the tasks of one barrier stage.

``sc.parallelize(range(n), n).barrier().mapPartitions(task)``: every task learns the
executors' addresses from :meth:`BarrierTaskContext.getTaskInfos`; rank 0 starts the
collective :class:`~hora.native.rendezvous.RendezvousServer` and shares its host and
port with :meth:`BarrierTaskContext.allGather`; local ranks come from the hosts; GPU
addresses of the task (``resources()["gpu"]``) become ``CUDA_VISIBLE_DEVICES``. Each task
runs its rank as a subprocess through :func:`hora.runners.worker.supervise`.

The job runs in the job group ``hora-<run_id>`` with the description
``"hora: train <run_id>"`` (visible in the Spark UI) and is cancelled when the driver is
interrupted or a rank fails. The job secret travels inside the pickled task closure; it
is never in a job description or property.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

from hora.errors import ConfigError, WorkerFailedError
from hora.native.rendezvous import RendezvousServer, compute_placement
from hora.runners.base import Job, Launcher
from hora.runners.driver import DriverService
from hora.runners.spec import (
    DEFAULT_TERMINATE_GRACE,
    ENV_ADVERTISE_ADDR,
    ENV_TERMINATE_GRACE,
    LaunchSpec,
    RankContext,
    env_seconds,
)

log = logging.getLogger(__name__)

_LOCAL_RE = re.compile(r"^local(?:\[(\*|\d+)(?:\s*,\s*\d+)?\])?$")
_LOCAL_CLUSTER_RE = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]$")


def _spark_task(spec: LaunchSpec, advertise: str | None, _partition: Iterator[Any]) -> Iterator[tuple[int, bytes]]:
    """The body of one barrier task: rendezvous through the BarrierTaskContext, then supervise the rank."""
    import cloudpickle
    from pyspark import BarrierTaskContext

    from hora.runners.worker import supervise

    context = BarrierTaskContext.get()
    rank = context.partitionId()
    infos = context.getTaskInfos()
    hosts = [advertise or info.address.rsplit(":", 1)[0] for info in infos]
    placement = compute_placement(hosts)[rank]
    server: RendezvousServer | None = None
    try:
        if rank == 0:
            bind = "127.0.0.1" if hosts[0].startswith("127.") else "0.0.0.0"
            server = RendezvousServer(spec.secret, host=bind, port=0)
            server.start()
            message = f"{hosts[0]}:{server.addr.rpartition(':')[2]}"
        else:
            message = ""
        rendezvous_addr = context.allGather(message)[0]
        extra_env: list[tuple[str, str]] = []
        gpu = context.resources().get("gpu")
        if gpu is not None and gpu.addresses:
            extra_env.append(("CUDA_VISIBLE_DEVICES", ",".join(gpu.addresses)))
        ctx = RankContext(
            rank=rank,
            size=len(hosts),
            local_rank=placement.local_rank,
            local_size=placement.local_size,
            cross_rank=placement.cross_rank,
            cross_size=placement.cross_size,
            hostname=hosts[rank],
            rendezvous_addr=rendezvous_addr,
            extra_env=tuple(extra_env),
        )
        value = supervise(spec, ctx)
        context.barrier()  # rank 0 keeps the rendezvous up until every rank is done
        yield rank, cloudpickle.dumps(value)
    finally:
        if server is not None:
            server.stop()


def _short_spark_error(exc: BaseException) -> str:
    text = str(exc)
    match = re.search(r"(hora\.errors\.WorkerFailedError: [^\n]*)", text)
    if match:
        return match.group(1)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " / ".join(lines[:3])[:1000]


class SparkJob(Job):
    """One barrier stage running on a background thread of the driver."""

    def __init__(self, backend: SparkLauncher, spec: LaunchSpec, service: DriverService) -> None:
        self.sc = backend.sc
        self.spec = spec
        self.service = service
        self.group = f"hora-{spec.run_id}"
        self.description = f"hora: train {spec.run_id}"
        self.advertise = backend.advertise
        self._results: list[tuple[int, bytes]] | None = None
        self._error: BaseException | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, name=f"hora-spark-{spec.run_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.sc.setJobGroup(self.group, self.description, interruptOnCancel=True)
            n = self.spec.num_proc
            rdd = self.sc.parallelize(range(n), n).barrier().mapPartitions(
                functools.partial(_spark_task, self.spec, self.advertise)
            )
            self._results = rdd.collect()
        except BaseException as exc:
            self._error = exc
        finally:
            try:
                self.sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
                self.sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
            except Exception:
                pass

    def poll(self) -> list[Any] | None:
        if self._thread.is_alive():
            return None
        if self._error is not None:
            raise WorkerFailedError(
                f"the Spark barrier stage of run {self.spec.run_id} failed: {_short_spark_error(self._error)}"
            )
        import cloudpickle

        assert self._results is not None
        by_rank = dict(self._results)
        return [cloudpickle.loads(by_rank[r]) for r in range(self.spec.num_proc)]

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        if self._thread.is_alive():
            log.info("cancelling Spark job group %s", self.group)
            self.sc.cancelJobGroup(self.group)
        grace = env_seconds(ENV_TERMINATE_GRACE, DEFAULT_TERMINATE_GRACE)
        self._thread.join(timeout=grace + 30)
        if self._thread.is_alive():
            log.warning("the Spark job of run %s did not end within %.0fs of its cancellation", self.spec.run_id, grace + 30)
        started = set(self.service.started())
        left = self.service.wait_exited(started, grace + 5)
        if left:
            log.warning("rank(s) %s of run %s did not confirm that their processes stopped", sorted(left), self.spec.run_id)


class SparkLauncher(Launcher):
    """Ranks as the tasks of one Spark barrier stage.

    Args:
        spark: the SparkSession (default: the active one).

    Raises:
        ConfigError: no SparkSession is active and none was given.
    """

    name = "spark"

    def __init__(self, spark: Any = None) -> None:
        if spark is None:
            from pyspark.sql import SparkSession

            spark = SparkSession.getActiveSession()
            if spark is None:
                raise ConfigError("backend='spark' needs a SparkSession: start one or pass spark=")
        self.spark = spark
        self.sc = spark.sparkContext
        self.master = self.sc.master
        self.local_mode = self.master.startswith("local")
        override = os.environ.get(ENV_ADVERTISE_ADDR)
        self.advertise: str | None = override or ("127.0.0.1" if self.local_mode else None)

    def slots(self) -> int:
        """How many tasks can run at once (local master: its threads; else the default parallelism)."""
        task_cpus = int(self.sc.getConf().get("spark.task.cpus", "1") or 1)
        m = _LOCAL_RE.match(self.master)
        if m:
            threads = m.group(1)
            total = 1 if threads is None else (os.cpu_count() or 1) if threads == "*" else int(threads)
            return max(0, total // task_cpus)
        m = _LOCAL_CLUSTER_RE.match(self.master)
        if m:
            return int(m.group(1)) * int(m.group(2)) // task_cpus
        return int(self.sc.defaultParallelism)

    def default_num_proc(self) -> int:
        return int(self.sc.defaultParallelism)

    def check_num_proc(self, num_proc: int) -> None:
        slots = self.slots()
        if num_proc > slots:
            raise ConfigError(
                f"num_proc={num_proc} needs {num_proc} task slots at once (one barrier stage), but the Spark "
                f"cluster ({self.master}) has {slots}; lower num_proc or add executors/cores"
            )

    def driver_addresses(self) -> tuple[str, str]:
        if self.advertise is not None and self.advertise.startswith("127."):
            return ("127.0.0.1", self.advertise)
        host = os.environ.get(ENV_ADVERTISE_ADDR) or self.sc.getConf().get("spark.driver.host") or "127.0.0.1"
        return ("0.0.0.0", host)

    def start(self, spec: LaunchSpec, service: DriverService) -> Job:
        return SparkJob(self, spec, service)


__all__ = ["SparkLauncher", "SparkJob"]
