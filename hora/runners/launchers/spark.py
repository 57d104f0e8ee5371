"""Spark launcher: the ranks are the tasks of one barrier stage, started from the DataFrame API.

``spark.range(n, numPartitions=n).mapInArrow(task, schema, barrier=True, profile=...)``:
one code path for classic and Spark Connect sessions (a Connect client has no
SparkContext). Every task tells the others its host (``HORA_ADVERTISE_ADDR`` or
``SPARK_LOCAL_IP`` of its executor, else the address in
:meth:`BarrierTaskContext.getTaskInfos`) through :meth:`BarrierTaskContext.allGather`;
rank 0 starts the collective :class:`~hora.native.rendezvous.RendezvousServer` and sends
its address in the same exchange; local ranks come from the hosts; the task's GPU
addresses (``resources()["gpu"]``) become ``CUDA_VISIBLE_DEVICES``. Each task runs its
rank as a subprocess through :func:`hora.runners.rank.supervise.supervise` and returns the
rank's pickled value as rows of the stage's result (in chunks, so large values cross
Spark Connect's message limits).

Resources: with ``task_cpus`` or ``use_gpu`` the stage carries a task
``ResourceProfile`` (``task_cpus`` CPUs and one GPU per task), scheduled on the
executors the cluster already has, while the user's other jobs keep their settings.
Spark supports it on Standalone, YARN and Kubernetes with dynamic allocation off (a
barrier stage needs that anyway); local masters run the stage without a profile and
count slots with ``task_cpus``.

Reporting (the driver service): the ranks report to the client's
:class:`~hora.runners.driver.service.DriverService` over TCP when they can reach it (a classic
session, whose driver runs next to the executors' driver, or a Connect client they can
connect to). A Connect client may sit where no executor reaches it; before launching, a
tiny probe job (one task per rank) tries an authenticated ping of the client's service,
and when it fails the ranks report through the Store instead
(:mod:`hora.runners.driver.store_channel`: rank 0's task relays, the client polls; the same
progress bar, output and failures). ``channel=`` (or ``HORA_DRIVER_CHANNEL``) says
``"direct"`` or ``"store"`` instead of probing (``"auto"``).

Names in the Spark UI: the function of the stage is named ``hora: train <run_id>`` and
its jobs carry the tag ``hora-train-<run_id>`` (classic and Connect); on classic the job
description is ``hora: train <run_id>`` too (a Connect server writes its own
description). Cancellation goes by the tag. The job secret travels inside the pickled
task function; it is never in a job description, tag or property.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from hora import _spark, settings
from hora.errors import ConfigError, FaultKind, HoraError, WorkerFailedError
from hora.native import keys
from hora.native.rendezvous import ENV_START_TIMEOUT, KVClient, RendezvousServer, compute_placement
from hora.runners.launcher import Job, Launcher
from hora.runners.driver.service import DriverService
from hora.runners.driver.faults import with_spark_error
from hora.runners.launchers.spark_errors import engine_failure, executor_lost, stage_error
from hora.runners.driver.store_channel import StoreChannel, StoreMirror, StoreRelay, wait_mirrored
from hora.runners.spec import (
    ENV_ADVERTISE_ADDR,
    ENV_TERMINATE_GRACE,
    LaunchSpec,
    RankContext,
)

log = logging.getLogger(__name__)

_LOCAL_RE = re.compile(r"^local(?:\[(\*|\d+)(?:\s*,\s*\d+)?\])?$")
_LOCAL_CLUSTER_RE = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]$")

#: The stage's result: each rank's pickled value, cut into chunks of at most CHUNK_BYTES.
RESULT_SCHEMA = "rank int, seq int, chunk binary"
CHUNK_BYTES = 1 << 20
#: seconds between two heartbeats of a Spark rank (``LaunchSpec.beat_interval``; 1 s elsewhere)
BEAT_INTERVAL = 0.25
#: seconds without a heartbeat after which a rank whose supervisor Spark lost counts as stopped
#: (its watchdog beats every BEAT_INTERVAL and ends the rank within 0.25 s of its supervisor's
#: death, :mod:`hora.runners.rank.main`): 4 beats
SILENT_AFTER = 1.0

#: How the ranks report to the client: "auto" (probe on Connect), "direct" (TCP) or "store".
ENV_DRIVER_CHANNEL = "HORA_DRIVER_CHANNEL"
CHANNELS = ("auto", "direct", "store")
REACH_TIMEOUT = 5.0  # seconds a probe task tries to connect to the client's service
_reach_cache: dict[tuple[str, str], str] = {}  # (session id, advertised host) -> "" or why unreachable


def _is_loopback(host: str) -> bool:
    return host.startswith("127.") or host == "localhost"


def _task_host(task_address: str) -> str:
    """The address this task's peers reach it at: ``HORA_ADVERTISE_ADDR`` or ``SPARK_LOCAL_IP`` of the
    executor when set (Spark binds there), else the host Spark's driver sees for the executor."""
    return os.environ.get(ENV_ADVERTISE_ADDR) or os.environ.get("SPARK_LOCAL_IP") or task_address.rsplit(":", 1)[0]


def _barrier_task(spec: LaunchSpec, advertise: str | None, channel: StoreChannel | None,
                  batches: Iterator[Any]) -> Iterator[Any]:
    """The body of one barrier task: rendezvous through the BarrierTaskContext, supervise the rank,
    yield its pickled value as ``(rank, seq, chunk)`` rows. With a store ``channel``, rank 0's
    rendezvous server is also the ranks' driver service, relayed to the Store."""
    import cloudpickle
    import pyarrow as pa
    from pyspark import BarrierTaskContext

    from hora.runners.rank.supervise import supervise

    for _ in batches:  # the input is one row of spark.range per task
        pass
    context = BarrierTaskContext.get()
    rank = context.partitionId()
    me = advertise or _task_host(context.getTaskInfos()[rank].address)
    server: RendezvousServer | None = None
    relay: StoreRelay | None = None
    try:
        message = {"host": me}
        if rank == 0:
            server = RendezvousServer(spec.secret, host=me if _is_loopback(me) else "0.0.0.0", port=0)
            server.start()
            message["rendezvous"] = f"{me}:{server.addr.rpartition(':')[2]}"
            if channel is not None:
                relay = StoreRelay(server, channel, spec.secret)
        if channel is None:  # the driver's service is reachable: meet there, not at Spark's barrier
            gathered = _gather_at_driver(spec, context, rank, message)
        else:
            gathered = [json.loads(m) for m in context.allGather(json.dumps(message))]
        hosts = [m["host"] for m in gathered]
        rendezvous_addr = gathered[0]["rendezvous"]
        if channel is not None:  # report to rank 0's server; its relay forwards to the Store
            spec = dataclasses.replace(spec, driver_addr=rendezvous_addr)
        placement = compute_placement(hosts)[rank]
        extra_env: list[tuple[str, str]] = []
        gpu = context.resources().get("gpu")
        if gpu is not None and gpu.addresses:
            extra_env.append(("CUDA_VISIBLE_DEVICES", ",".join(gpu.addresses)))
        ctx = RankContext(placement=placement, rendezvous_addr=rendezvous_addr, extra_env=tuple(extra_env))
        try:
            value = cloudpickle.dumps(supervise(spec, ctx))
        except WorkerFailedError:
            if channel is not None and not wait_mirrored(rendezvous_addr, spec.secret, rank):
                log.warning("rank %d: its failure report did not reach the store channel in time", rank)
            raise
        _release_rendezvous(spec, rank, len(hosts), rendezvous_addr, server)
        chunks = [value[i : i + CHUNK_BYTES] for i in range(0, len(value), CHUNK_BYTES)] or [b""]
        yield pa.RecordBatch.from_pydict({
            "rank": pa.array([rank] * len(chunks), pa.int32()),
            "seq": pa.array(range(len(chunks)), pa.int32()),
            "chunk": pa.array(chunks, pa.binary()),
        })
    finally:
        if relay is not None:
            relay.close()
        if server is not None:
            server.stop()


def _gather_at_driver(spec: LaunchSpec, context: Any, rank: int, message: dict[str, str]) -> list[dict[str, str]]:
    """Every task's ``message`` (its host; rank 0's also its rendezvous address), in rank order,
    exchanged through the driver's service.

    What ``BarrierTaskContext.allGather`` does, without its cost: Spark's barrier calls poll
    their coordinator once a second, so the first tasks to arrive waited up to a second on
    every fit. Keys carry the stage's id. A stage that Spark itself retries (pyspark does not
    expose the stage's attempt number) may read an earlier attempt's messages; hora aborts
    the run's attempt at the first failure anyway, and the retried tasks then fail to reach
    the earlier rank 0 within ``HORA_RENDEZVOUS_TIMEOUT`` rather than wait on Spark.

    Raises:
        RendezvousError: a task's message did not arrive within ``HORA_START_TIMEOUT`` (named).
    """
    size = len(context.getTaskInfos())
    prefix = f"{keys.TASK_HELLO}{context.stageId()}/"
    client = KVClient(spec.driver_addr, spec.secret, timeout=settings.get(ENV_START_TIMEOUT, {**os.environ, **spec.env_dict}))
    try:
        client.set(prefix + str(rank), json.dumps(message).encode())
        return [json.loads(v) for v in client.wait([prefix + str(r) for r in range(size)])]
    finally:
        client.close()


def _prestart_task(run_env: dict[str, str], batches: Iterator[Any]) -> Iterator[Any]:
    """One task of :meth:`SparkLauncher.prestart`: start this executor's warm rank server in the
    background and return at once (the task slot is free again for the materialization)."""
    import pyarrow as pa

    from hora.runners.rank.supervise import prestart_rank_server

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"started": pa.array([prestart_rank_server(run_env)], pa.bool_())})


def _release_rendezvous(spec: LaunchSpec, rank: int, size: int, rendezvous_addr: str,
                        server: RendezvousServer | None) -> None:
    """Rank 0's task keeps its rendezvous server up until every other task is done with it.

    The other tasks' supervisors still talk to that server after their rank returns (their
    exit, their last output lines when it relays to a Store channel). Each sets
    ``runner/task_done/<rank>`` there and goes on; rank 0 waits for all of them. Spark's own
    ``BarrierTaskContext.barrier()`` did this before, but its tasks poll the coordinator once
    a second, so every fit paid up to a second for it.
    """
    if rank != 0:
        client = KVClient(rendezvous_addr, spec.secret, timeout=30.0)
        try:
            client.set(keys.rank_key(keys.TASK_DONE, rank), b"1")
        except HoraError as exc:  # rank 0's task is gone already: nothing waits for this one
            log.warning("rank %d: could not tell rank 0's task that it is done: %s", rank, exc)
        finally:
            client.close()
        return
    assert server is not None
    wanted = [keys.rank_key(keys.TASK_DONE, r) for r in range(1, size)]
    timeout = float(settings.get(ENV_TERMINATE_GRACE)) + 30
    try:
        server.wait(wanted, timeout)
    except HoraError:
        done = set(server.keys(keys.TASK_DONE))
        log.warning("run %s: the Spark task(s) of rank(s) %s did not report done within %.0f s; stopping the "
                    "rendezvous server anyway", spec.run_id, [r for r, k in enumerate(wanted, 1) if k not in done],
                    timeout)


def _reach_task(addr: str, secret: bytes, batches: Iterator[Any]) -> Iterator[Any]:
    """A probe task: ping the client's driver service; yield '' or why it failed."""
    import pyarrow as pa

    from hora.native.rendezvous import KVClient

    for _ in batches:
        pass
    error = ""
    try:
        client = KVClient(addr, secret, timeout=REACH_TIMEOUT)
        try:
            if not client.ping():
                error = f"{addr} answered, but not as this run's driver service"
        finally:
            client.close()
    except Exception as exc:  # reported to the client as text
        error = f"{type(exc).__name__}: {exc}"
    yield pa.RecordBatch.from_pydict({"error": pa.array([error], pa.string())})


class SparkJob(Job):
    """One barrier stage running on a background thread of the driver."""

    def __init__(self, launcher: SparkLauncher, spec: LaunchSpec, service: DriverService,
                 channel: StoreChannel | None = None) -> None:
        self.launcher = launcher
        self.spark = launcher.spark
        self.spec = spec = dataclasses.replace(spec, beat_interval=BEAT_INTERVAL)  # for the silence proof
        self.service = service
        self.channel = channel
        self.mirror = StoreMirror(service.server, channel, spec.secret) if channel is not None else None
        self.tag = f"hora-train-{spec.run_id}"
        self.description = f"hora: train {spec.run_id}"
        self._rows: list[Any] | None = None
        self._error: BaseException | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, name=f"hora-spark-{spec.run_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            n = self.spec.num_proc
            task = functools.partial(_barrier_task, self.spec, self.launcher.advertise, self.channel)
            task.__name__ = self.description  # type: ignore[attr-defined]  # the UDF's name in the Spark UI
            with _spark.job_scope(self.spark, self.tag, self.description), _spark.console_progress_paused(self.spark):
                frame = self.spark.range(0, n, 1, numPartitions=n)
                stage = frame.mapInArrow(task, RESULT_SCHEMA, barrier=True, profile=self.launcher.profile())
                self._rows = stage.collect()
        except BaseException as exc:
            log.debug("run %s: its Spark job failed: %s", self.spec.run_id, str(exc).strip().splitlines()[:1])
            self._error = exc

    def poll(self) -> list[Any] | None:
        if self._thread.is_alive():
            return None
        if self._error is not None:
            self._sync_mirror()  # the ranks' own failure reports first
            raise stage_error(self._error, self.spec, self.launcher) from None
        import cloudpickle

        assert self._rows is not None
        chunks: dict[int, list[tuple[int, bytes]]] = {}
        for row in self._rows:
            chunks.setdefault(int(row["rank"]), []).append((int(row["seq"]), bytes(row["chunk"])))
        missing = [r for r in range(self.spec.num_proc) if r not in chunks]
        if missing:
            raise WorkerFailedError(f"the Spark stage of run {self.spec.run_id} returned no result for rank(s) {missing}")
        return [cloudpickle.loads(b"".join(c for _, c in sorted(chunks[r]))) for r in range(self.spec.num_proc)]

    def _lost_supervisors(self) -> set[int]:
        """The ranks whose supervisor Spark says is gone: the task whose Python worker crashed, or
        every task on the host of a lost executor's task
        (:func:`~hora.runners.launchers.spark_errors.engine_failure`). Nobody is left to report
        that their processes stopped (a rank on that host under another, live executor still
        stops: its silence counts then, see :meth:`_wait_silent`)."""
        if self._thread.is_alive() or self._error is None:
            return set()
        text = str(self._error)
        kind, rank, message = engine_failure(text)
        if kind is not FaultKind.LOST or rank is None or message is None:
            return set()
        if not executor_lost(text):
            return {rank}
        hosts = self.service.started()
        return {rank} | {r for r, host in hosts.items() if rank in hosts and host == hosts[rank]}

    def _wait_silent(self, ranks: set[int], timeout: float) -> set[int]:
        """Wait up to ``timeout`` s until ``ranks`` (their supervisors lost) have stopped
        heartbeating for :data:`SILENT_AFTER` s, or exited; return those that did not. A rank's
        watchdog beats every second and ends the rank when its supervisor is gone, so its
        silence is its process gone: waiting for a supervisor's word cost every lost
        executor or Python worker ``HORA_TERMINATE_GRACE`` + 5 s before the relaunch."""
        if not ranks:
            return set()
        deadline = time.monotonic() + timeout
        while True:
            left = ranks - set(self.service.stale_heartbeats(SILENT_AFTER, ignore=set())) - self.service.exited()
            if not left or time.monotonic() >= deadline:
                log.debug("run %s: rank(s) %s lost their supervisor; silent: %s", self.spec.run_id, sorted(ranks),
                          sorted(ranks - left))
                return left
            time.sleep(0.1)

    def _sync_mirror(self) -> None:
        if self.mirror is not None:
            try:
                self.mirror.sync()
            except Exception as exc:  # the monitor still has the stage's own error
                log.warning("could not read the store channel of run %s: %s", self.spec.run_id, exc)

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        t0 = time.monotonic()
        if self._thread.is_alive():
            log.info("cancelling the Spark jobs tagged %s", self.tag)
            try:
                _spark.cancel_jobs(self.spark, self.tag)
            except Exception as exc:  # the session may be gone; the ranks still stop on the driver's abort
                log.warning("could not cancel the Spark jobs of run %s: %s", self.spec.run_id, exc)
        grace = float(settings.get(ENV_TERMINATE_GRACE))
        self._thread.join(timeout=grace + 30)
        if self._thread.is_alive():
            log.warning("the Spark job of run %s did not end within %.0fs of its cancellation", self.spec.run_id, grace + 30)
        self._sync_mirror()
        started = set(self.service.started())
        lost = self._lost_supervisors() & started
        left = self.service.wait_exited(started - lost, grace + 5)
        left |= self._wait_silent(lost, grace + 5)
        if left:
            log.warning("rank(s) %s of run %s did not confirm that their processes stopped", sorted(left), self.spec.run_id)
        if self.mirror is not None:
            self.mirror.close()
        log.debug("run %s: its Spark job cancelled and its ranks stopped in %.2f s", self.spec.run_id,
                  time.monotonic() - t0)


class SparkLauncher(Launcher):
    """Ranks as the tasks of one Spark barrier stage, on a classic or a Spark Connect session.

    Args:
        spark: the SparkSession (default: the active one; classic first, then Connect).
        task_cpus: CPUs per training task; with it (or ``use_gpu``) the stage asks for its
            resources through a task ResourceProfile. Default: ``spark.task.cpus``.
        use_gpu: one GPU per training task (its address becomes ``CUDA_VISIBLE_DEVICES``).
        channel: how the ranks report to this client: ``"auto"`` (default, or
            ``HORA_DRIVER_CHANNEL``): directly, unless a probe job finds that the executors
            of a Connect session cannot reach it, then through the run's Store;
            ``"direct"``: always over TCP; ``"store"``: always through the Store.

    Raises:
        ConfigError: no SparkSession is active and none was given, ``task_cpus`` is not an
            int >= 1, an unknown ``channel``, or a Connect server older than Spark 4.0.
    """

    name = "spark"
    prestart_takes_slots = True  # its job's tasks hold the slots the training stage needs

    def __init__(self, spark: Any = None, *, task_cpus: int | None = None, use_gpu: bool = False,
                 channel: str | None = None) -> None:
        if task_cpus is not None and (isinstance(task_cpus, bool) or not isinstance(task_cpus, int) or task_cpus < 1):
            raise ConfigError(f"task_cpus must be an int >= 1 or None, got {task_cpus!r}")
        if not isinstance(use_gpu, bool):
            raise ConfigError(f"use_gpu must be True or False, got {use_gpu!r}")
        if channel is not None and channel not in CHANNELS:
            raise ConfigError(f"channel must be one of {', '.join(CHANNELS)}, got {channel!r}")
        self.channel = channel if channel is not None else str(settings.get(ENV_DRIVER_CHANNEL)).lower()
        self.spark = _spark.active_session(spark)
        self.connect = _spark.is_connect(self.spark)
        _spark.check_connect_server(self.spark)
        self.master = _spark.master(self.spark)
        self.local_mode = bool(_LOCAL_RE.match(self.master))
        self.task_cpus = task_cpus or int(_spark.conf_get(self.spark, "spark.task.cpus", "1") or 1)
        self.use_gpu = use_gpu
        self.wants_profile = task_cpus is not None or use_gpu
        # local masters run every task in the driver's host: loopback; elsewhere each task finds its own
        self.advertise: str | None = "127.0.0.1" if self.local_mode else None
        self._profile: Any = None
        self._parallelism: int | None = None

    def describe_task(self) -> str:
        """What one training task asks for, for messages."""
        return f"with {self.task_cpus} CPU(s){' and 1 GPU' if self.use_gpu else ''} each"

    def profile(self) -> Any:
        """The task ResourceProfile of the training stage, or None (no request, or a local master)."""
        if not self.wants_profile:
            return None
        if self.local_mode:
            # Spark refuses task profiles on local masters; local tasks share the driver's cores anyway
            log.debug("local master %s: the training stage runs without a ResourceProfile", self.master)
            return None
        if self._profile is None:
            self._profile = _spark.task_profile(self.spark, self.task_cpus, 1 if self.use_gpu else 0)
        return self._profile

    def _default_parallelism(self) -> int:
        if self._parallelism is None:
            self._parallelism = _spark.default_parallelism(self.spark)
        return self._parallelism

    def slots(self) -> int:
        """How many training tasks can run at once: a local master's threads (or a local
        cluster's cores) per task's CPUs; on a cluster, the default parallelism per task's CPUs
        (Spark checks the exact count against the profile when the stage starts)."""
        m = _LOCAL_RE.match(self.master)
        if m:
            threads = m.group(1)
            total = 1 if threads is None else (os.cpu_count() or 1) if threads == "*" else int(threads)
            return max(0, total // self.task_cpus)
        m = _LOCAL_CLUSTER_RE.match(self.master)
        if m:
            return int(m.group(1)) * (int(m.group(2)) // self.task_cpus)
        return self._default_parallelism() // self.task_cpus

    def default_num_proc(self) -> int:
        return max(1, self.slots())

    def refresh_slots(self) -> None:
        # (hora.runners.driver.recovery, before a relaunch) a lost executor takes its cores along
        self._parallelism = None

    def check_num_proc(self, num_proc: int) -> None:
        slots = self.slots()
        if num_proc > slots:
            raise ConfigError(
                f"num_proc={num_proc} needs {num_proc} task slots at once (one barrier stage) {self.describe_task()}, "
                f"but the Spark cluster ({self.master}) has {slots}; lower num_proc or add executors/cores"
            )

    def driver_addresses(self) -> tuple[str, str]:
        host = os.environ.get(ENV_ADVERTISE_ADDR)
        if not host and self.connect:
            # the client may sit outside the cluster: its address on the route to the Connect server
            server = _spark.connect_server_host(self.spark)
            host = _spark.address_towards(server) if server else None
        if not host and self.advertise is not None:
            host = self.advertise
        if not host:
            host = _spark.conf_get(self.spark, "spark.driver.host") or "127.0.0.1"
        if host == "localhost":
            host = "127.0.0.1"
        return ("127.0.0.1" if _is_loopback(host) else "0.0.0.0", host)

    def reach_error(self, spec: LaunchSpec, service: DriverService) -> str:
        """Why the executors cannot reach the client's driver service ('' when they can).

        One probe job of ``num_proc`` tasks, each an authenticated ping of the service;
        the answer is kept per session and advertised host.

        Raises:
            ConfigError: the executors cannot import hora, or the probe job never ran.
        """
        host = service.addr.rpartition(":")[0]
        key = (_spark.session_key(self.spark), host)
        if key in _reach_cache:
            return _reach_cache[key]
        n = spec.num_proc
        task = functools.partial(_reach_task, service.addr, spec.secret)
        task.__name__ = f"hora: can the executors reach {host}"  # type: ignore[attr-defined]
        frame = self.spark.range(0, n, 1, numPartitions=n).mapInArrow(task, "error string")
        try:
            rows = _spark.collect(self.spark, frame, f"hora-reach-{spec.run_id}", task.__name__,
                                  timeout=_spark.PROBE_TIMEOUT)
        except TimeoutError as exc:
            raise ConfigError(f"could not check whether the executors reach this client at {service.addr}: {exc}") from exc
        except Exception as exc:
            missing = _spark.missing_hora(exc)
            if missing is None:
                raise
            raise with_spark_error(missing, exc) from None
        errors = sorted({str(r["error"]) for r in rows if r["error"]})
        _reach_cache[key] = "; ".join(errors)
        return _reach_cache[key]

    def _channel_for(self, spec: LaunchSpec, service: DriverService) -> StoreChannel | None:
        """None (report over TCP) or the Store channel, as ``channel`` and the probe say.

        Raises:
            ConfigError: the ranks must report through the Store but the run has none.
            StoreError: the executors cannot use the run's Store.
        """
        if self.channel == "direct" or (self.channel == "auto" and not self.connect):
            return None
        if self.channel == "auto":
            error = self.reach_error(spec, service)
            if not error:
                return None
            host = service.addr.rpartition(":")[0]
            why = f"the Spark executors cannot reach this client's driver service on {host} (probe: {error})"
        else:
            why = "channel='store' was asked for"
        if service.store is None:
            raise ConfigError(
                f"{why}: pass store= (a Store this client and the executors both reach) so the ranks report through "
                f"it, or set {ENV_ADVERTISE_ADDR} to an address of this machine the executors can connect to"
            )
        from hora.store.spark_source import check_executors_reach

        check_executors_reach(self.spark, service.store)
        log.info("%s: the ranks of run %s report through the store %s", why, spec.run_id, service.store.url)
        return StoreChannel(service.store, spec.run_id)

    def prestart(self, num_proc: int, env: Mapping[str, str]) -> None:
        """Start the executors' warm rank servers (:func:`hora.runners.rank.supervise.prestart_rank_server`)
        from one short job of ``num_proc`` tasks, on a background thread of the driver: the
        servers import torch while the fit checks and materializes its data, and the training
        stage's tasks, in whichever Python worker of their executor they run, fork their ranks
        from them. On a cluster the job's tasks may land on other executors than the training
        stage's: a server that serves no rank ends after ``HORA_WARM_IDLE_TIMEOUT``."""
        from hora.runners.rank.warm import client as warm

        if not warm.enabled({**os.environ, **env}):
            return
        task = functools.partial(_prestart_task, dict(env))
        task.__name__ = "hora: start the ranks' warm servers"  # type: ignore[attr-defined]

        def job() -> None:
            try:
                with _spark.job_scope(self.spark, f"hora-prestart-{os.getpid()}-{threading.get_ident()}",
                                      "hora: start the ranks' warm servers"):
                    frame = self.spark.range(0, num_proc, 1, numPartitions=num_proc)
                    started = sum(bool(r["started"]) for r in frame.mapInArrow(task, "started boolean").collect())
                log.debug("started %d warm rank server(s) ahead of the ranks", started)
            except Exception as exc:  # the ranks then start their servers themselves
                log.debug("could not start the warm rank servers ahead of the ranks: %s", exc)

        threading.Thread(target=job, name="hora-spark-prestart", daemon=True).start()

    def start(self, spec: LaunchSpec, service: DriverService) -> Job:
        return SparkJob(self, spec, service, self._channel_for(spec, service))


__all__ = ["SparkLauncher", "SparkJob", "CHANNELS", "ENV_DRIVER_CHANNEL"]
