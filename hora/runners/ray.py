"""Ray launcher: each rank is a Ray actor in one placement group.

``hora.runners.run(fn, num_proc=4, backend="ray")`` or, with resources per rank,
``backend=RayLauncher(cpus_per_rank=2, gpus_per_rank=1, strategy="SPREAD")``.

A :class:`RayWorkerGroup` reserves one placement-group bundle per rank (``PACK``,
``SPREAD``, ``STRICT_PACK`` or ``STRICT_SPREAD``), waits for it within
``placement_timeout`` (a group that cannot be scheduled is an error naming what was
asked and what the cluster has, never a hang), starts one :class:`RankActor` per
bundle and orders the ranks so the ranks of one node are contiguous: ``local_rank``,
``local_size`` and ``cross_rank`` follow the actors' nodes, and ranks on one node use
shared memory. Each rank runs in its actor's own process
(:func:`hora.runners.worker.run_rank`), so Ray's GPU assignment
(``CUDA_VISIBLE_DEVICES``) is the rank's, and :class:`hora.ray.RayExecutor` can keep
objects in the actors between calls. The rank's Python output goes to the driver
service (printed prefixed by rank, as every launcher does); its value comes back
through Ray's object store.

Failures are the monitor's (:mod:`hora.runners.monitor`): a rank that raised (its own
report, with the traceback), and an actor that died (``ray.kill``, its process killed,
its node lost), reported as lost the moment Ray tells.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from hora.errors import ConfigError, RendezvousError, WorkerFailedError
from hora.native.rendezvous import KVClient, compute_placement
from hora.runners.base import Job, Launcher, start_or_cancel
from hora.runners.driver import DriverService
from hora.runners.monitor import Failure
from hora.runners.network import is_loopback
from hora.runners.spec import (
    DEFAULT_TERMINATE_GRACE,
    ENV_ADVERTISE_ADDR,
    ENV_TERMINATE_GRACE,
    LaunchSpec,
    RankContext,
    env_seconds,
)

log = logging.getLogger(__name__)

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
ENV_PLACEMENT_TIMEOUT = "HORA_RAY_PLACEMENT_TIMEOUT"
DEFAULT_PLACEMENT_TIMEOUT = 100.0  # seconds, Horovod's placement_group_timeout_s
STOP_TIMEOUT = 15.0  # seconds for killed actors to be confirmed dead


def require_ray() -> Any:
    """The ``ray`` module, initialised (``ray.init()`` with its defaults when no cluster is
    connected yet: ``RAY_ADDRESS``, a running local cluster, or a new one).

    Raises:
        ImportError: Ray is not installed (``pip install 'hora[ray]'``).
        ConfigError: the driver is a Ray Client (``ray://``): ranks could not reach it.
    """
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"the Ray launcher needs Ray: pip install 'hora[ray]' ({exc})") from exc
    if not ray.is_initialized():
        log.info("Ray is not initialised; calling ray.init()")
        ray.init()
    if ray.util.client.ray.is_connected():
        raise ConfigError("hora's Ray launcher cannot run from a Ray Client (ray://) driver: the ranks report to a "
                          "service on the driver; run the script on the cluster (ray job submit)")
    return ray


@dataclasses.dataclass(frozen=True)
class RayResources:
    """What each rank asks of Ray, and how the ranks are placed.

    Attributes:
        cpus_per_rank: CPUs per rank (may be fractional).
        gpus_per_rank: GPUs per rank (0: none; Ray sets the rank's ``CUDA_VISIBLE_DEVICES``).
        resources_per_rank: custom Ray resources per rank, ``{"name": amount}``.
        strategy: the placement group's strategy: PACK, SPREAD, STRICT_PACK, STRICT_SPREAD.
        ranks_per_bundle: ranks sharing one bundle (Horovod's ``num_workers_per_host``:
            with STRICT_SPREAD, one bundle per node).
        placement_timeout: seconds the placement group may take to be scheduled.

    Raises:
        ConfigError: a negative amount, an unknown strategy, a non-positive timeout.
    """

    cpus_per_rank: float = 1.0
    gpus_per_rank: float = 0.0
    resources_per_rank: tuple[tuple[str, float], ...] = ()
    strategy: str = "PACK"
    ranks_per_bundle: int = 1
    placement_timeout: float = DEFAULT_PLACEMENT_TIMEOUT

    def __post_init__(self) -> None:
        for name in ("cpus_per_rank", "gpus_per_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"{name} must be a number >= 0, got {value!r}")
        for name, value in self.resources_per_rank:
            if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"resources_per_rank[{name!r}] must be a number >= 0, got {value!r}")
            if name in ("CPU", "GPU"):
                raise ConfigError(f"resources_per_rank may not name {name!r}: use cpus_per_rank / gpus_per_rank")
        if not isinstance(self.strategy, str) or self.strategy.upper() not in STRATEGIES:
            raise ConfigError(f"strategy {self.strategy!r} is unknown; use one of {', '.join(STRATEGIES)}")
        object.__setattr__(self, "strategy", self.strategy.upper())
        if isinstance(self.ranks_per_bundle, bool) or not isinstance(self.ranks_per_bundle, int) \
                or self.ranks_per_bundle < 1:
            raise ConfigError(f"ranks_per_bundle must be an int >= 1, got {self.ranks_per_bundle!r}")
        if not (isinstance(self.placement_timeout, (int, float)) and self.placement_timeout > 0):
            raise ConfigError(f"placement_timeout must be a positive number of seconds, got {self.placement_timeout!r}")

    def per_rank(self) -> dict[str, float]:
        """The resources of one rank (zero amounts left out)."""
        out = {"CPU": float(self.cpus_per_rank), "GPU": float(self.gpus_per_rank)}
        out.update({k: float(v) for k, v in self.resources_per_rank})
        return {k: v for k, v in out.items() if v > 0}

    def bundles(self, num_proc: int) -> list[dict[str, float]]:
        """The placement group's bundles for ``num_proc`` ranks.

        Raises:
            ConfigError: ``num_proc`` is not a multiple of ``ranks_per_bundle``.
        """
        if num_proc % self.ranks_per_bundle:
            raise ConfigError(f"num_proc={num_proc} is not a multiple of {self.ranks_per_bundle} ranks per bundle "
                              "(num_workers_per_host)")
        bundle = {k: v * self.ranks_per_bundle for k, v in self.per_rank().items()} or {"CPU": 0.001}
        return [dict(bundle) for _ in range(num_proc // self.ranks_per_bundle)]


def _fits(bundle: Mapping[str, float], have: Mapping[str, float]) -> int:
    """How many ``bundle`` fit in ``have``."""
    return int(min((have.get(k, 0.0) + 1e-9) // v for k, v in bundle.items())) if bundle else 1 << 30


def _relevant(resources: Mapping[str, float], names: Sequence[str]) -> dict[str, float]:
    return {k: resources.get(k, 0.0) for k in names}


def _alive_nodes(ray: Any) -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def capacity(ray: Any, resources: RayResources) -> int:
    """The most ranks the cluster's *total* resources could ever hold with this strategy."""
    bundle = resources.bundles(resources.ranks_per_bundle)[0]
    per_node = [_fits(bundle, n.get("Resources") or {}) for n in _alive_nodes(ray)]
    if resources.strategy == "STRICT_PACK":
        bundles = max(per_node, default=0)
    elif resources.strategy == "STRICT_SPREAD":
        bundles = sum(1 for n in per_node if n > 0)
    else:
        bundles = sum(per_node)
    return bundles * resources.ranks_per_bundle


class ActorInfo(NamedTuple):
    """Where one rank actor runs (answered by :meth:`RankActor.ready`)."""

    node_id: str
    node_ip: str
    pid: int
    gpu_ids: tuple[str, ...]


class _Sink(io.TextIOBase):
    """An actor's ``sys.stdout``/``sys.stderr``: lines go to the current run's driver,
    or to the actor's own stream (Ray's log) between runs."""

    def __init__(self, stream: str, fallback: Any) -> None:
        super().__init__()
        self.stream = stream
        self.fallback = fallback
        self.target: Callable[[str, str], None] | None = None
        self._buf = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            target = self.target
            if target is None:
                return self.fallback.write(text)
            self._buf += text
            *lines, self._buf = self._buf.split("\n")
        for line in lines:
            target(self.stream, line)
        return len(text)

    def flush(self) -> None:
        if self.target is None:
            self.fallback.flush()

    def fileno(self) -> int:
        return self.fallback.fileno()

    def isatty(self) -> bool:
        return False

    def attach(self, target: Callable[[str, str], None] | None) -> None:
        """Send lines to ``target`` from now on (None: back to the actor's own stream)."""
        with self._lock:
            rest, self._buf = self._buf, ""
            old, self.target = self.target, target
        if rest and old is not None:
            old(self.stream, rest)


def _stop_watchdogs() -> None:
    """Stop the heartbeat thread :func:`~hora.runners.worker.run_rank` leaves running after a
    failure: in a long-lived actor it would end the process at the driver's abort."""
    from hora.runners.spec import HEARTBEAT_INTERVAL

    for thread in threading.enumerate():
        stopped = getattr(thread, "stopped", None)
        if thread.name == "hora-watchdog" and isinstance(stopped, threading.Event):
            stopped.set()
            thread.join(timeout=HEARTBEAT_INTERVAL + 10)


class RankActor:
    """One rank's Ray actor: a dedicated worker process that runs ranks of hora runs."""

    def __init__(self) -> None:
        import sys

        self._out = _Sink("stdout", sys.stdout)
        self._err = _Sink("stderr", sys.stderr)
        sys.stdout, sys.stderr = self._out, self._err

    def ready(self) -> ActorInfo:
        """Where this actor runs."""
        import ray

        ctx = ray.get_runtime_context()
        return ActorInfo(ctx.get_node_id(), ray.util.get_node_ip_address(), os.getpid(),
                         tuple(str(g) for g in ray.get_gpu_ids()))

    def update_env(self, env: Mapping[str, str]) -> None:
        """Set environment variables in this actor's process."""
        os.environ.update({str(k): str(v) for k, v in env.items()})

    def call(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` in this actor, outside any hora run."""
        return fn()

    def run(self, spec: LaunchSpec, ctx: RankContext) -> Any:
        """Run rank ``ctx.rank`` of ``spec`` here; return ``fn``'s value.

        Raises:
            WorkerFailedError: the rank failed (rank, host, traceback, exit code).
        """
        from hora.runners.procs import describe_exit, last_traceback
        from hora.runners.worker import _LogPusher, read_result, run_rank

        client = KVClient(spec.driver_addr, spec.secret)
        pusher = _LogPusher(client, ctx.rank)
        tail: collections.deque[str] = collections.deque(maxlen=400)

        def forward(stream: str, line: str) -> None:
            if stream == "stderr":
                tail.append(line)
            pusher.add(ctx.rank, stream, line)

        tmpdir = tempfile.mkdtemp(prefix=f"hora-{spec.run_id}-rank{ctx.rank}-")
        path = os.path.join(tmpdir, "result.pkl")
        self._out.attach(forward)
        self._err.attach(forward)
        try:
            code = run_rank(spec, ctx, path)
            _stop_watchdogs()
            if code == 0:
                return read_result(path)
        finally:
            self._out.attach(None)
            self._err.attach(None)
            pusher.close()
            client.close()
            shutil.rmtree(tmpdir, ignore_errors=True)
        raise WorkerFailedError(f"rank {ctx.rank} failed with {describe_exit(code)}", rank=ctx.rank,
                                host=ctx.hostname, remote_traceback=last_traceback(list(tail)), exitcode=code)


class RayWorkerGroup:
    """``num_proc`` :class:`RankActor` s in one placement group, in rank order.

    Use :meth:`create`; :meth:`stop` kills the actors and removes the group it created.
    """

    def __init__(self, ray: Any, actors: list[Any], infos: list[ActorInfo], placement_group: Any,
                 owns_placement_group: bool) -> None:
        self.ray = ray
        self.actors = actors
        self.infos = infos
        self.placement_group = placement_group
        self.owns_placement_group = owns_placement_group
        self.stopped = False

    @property
    def num_proc(self) -> int:
        return len(self.actors)

    @classmethod
    def create(cls, num_proc: int, resources: RayResources, *, start_timeout: float,
               placement_group: Any = None, env: Mapping[str, str] | None = None) -> RayWorkerGroup:
        """Reserve a placement group (or use ``placement_group``), start one actor per rank
        and wait until every actor answers.

        Raises:
            ConfigError: the cluster's total resources can never hold the ranks.
            RendezvousError: the group was not scheduled within ``placement_timeout``, or
                actors did not start within ``start_timeout`` (both name what is missing).
            WorkerFailedError: an actor died while starting.
        """
        ray = require_ray()
        from ray.util.placement_group import placement_group as make_pg
        from ray.util.placement_group import remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        owns = placement_group is None
        if owns:
            check_capacity(ray, num_proc, resources)
            bundles = resources.bundles(num_proc)
            placement_group = make_pg(bundles, strategy=resources.strategy)
        group = cls(ray, [], [], placement_group, owns)
        try:
            if owns:
                wait_placement(ray, placement_group, bundles, resources)
            per_rank = resources.per_rank()
            remote = ray.remote(RankActor)
            actors = []
            for i in range(num_proc):
                bundle = i // resources.ranks_per_bundle if owns else -1
                actors.append(remote.options(
                    num_cpus=per_rank.get("CPU", 0), num_gpus=per_rank.get("GPU", 0),
                    resources={k: v for k, v in per_rank.items() if k not in ("CPU", "GPU")},
                    max_restarts=0, max_task_retries=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group, placement_group_bundle_index=bundle,
                        placement_group_capture_child_tasks=False)).remote())
            group.actors = actors
            infos = _wait_ready(ray, actors, start_timeout)
            order = _node_order(infos)  # the ranks of one node contiguous, nodes in order of first bundle
            group.actors, group.infos = [actors[i] for i in order], [infos[i] for i in order]
            if env:
                ray.get([a.update_env.remote(dict(env)) for a in group.actors], timeout=start_timeout)
        except BaseException:
            group.stop()
            raise
        log.info("Ray: %d rank actor(s) on %d node(s)", num_proc, len({i.node_id for i in group.infos}))
        return group

    def hosts(self, loopback: bool) -> list[str]:
        """The address each rank advertises (``HORA_HOSTNAME``): its node's IP, or 127.0.0.1
        for the driver's own node when the whole job is on this machine."""
        return [i.node_ip if (is_loopback(i.node_ip) or not loopback) else "127.0.0.1" for i in self.infos]

    def contexts(self, rendezvous_addr: str, loopback: bool) -> list[RankContext]:
        """Each rank's place: local/cross ranks from the actors' nodes."""
        hosts = self.hosts(loopback)
        n = self.num_proc
        return [RankContext(rank=p.rank, size=n, local_rank=p.local_rank, local_size=p.local_size,
                            cross_rank=p.cross_rank, cross_size=p.cross_size, hostname=hosts[p.rank],
                            rendezvous_addr=rendezvous_addr)
                for p in compute_placement([i.node_id for i in self.infos])]

    def alive(self, timeout: float = 10.0) -> list[int]:
        """The ranks whose actor answers within ``timeout`` seconds."""
        refs = [a.ready.remote() for a in self.actors]
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=timeout)
        out = []
        for rank, ref in enumerate(refs):
            if ref in ready:
                with contextlib.suppress(Exception):
                    self.ray.get(ref, timeout=0)
                    out.append(rank)
        return out

    def stop(self, pending: Sequence[Any] = ()) -> None:
        """Kill every actor, wait (up to :data:`STOP_TIMEOUT`) until Ray confirms, remove the
        placement group this group created (idempotent)."""
        if self.stopped:
            return
        self.stopped = True
        ray = self.ray
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        refs = list(pending)
        for actor in self.actors:  # resolves (with ActorDiedError) once Ray has the actor dead
            with contextlib.suppress(Exception):
                refs.append(actor.ready.remote())
        if refs:
            with contextlib.suppress(Exception):
                ray.wait(refs, num_returns=len(refs), timeout=STOP_TIMEOUT)
        if self.owns_placement_group and self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(self.placement_group)
        self.actors = []


def check_capacity(ray: Any, num_proc: int, resources: RayResources) -> None:
    """Fail at once when the cluster's total resources can never hold ``num_proc`` ranks.

    Raises:
        ConfigError: naming the resources asked per rank and the cluster's totals.
    """
    resources.bundles(num_proc)
    most = capacity(ray, resources)
    if num_proc > most:
        per_rank = resources.per_rank()
        total = _relevant(ray.cluster_resources(), list(per_rank))
        nodes = len(_alive_nodes(ray))
        raise ConfigError(
            f"num_proc={num_proc} ranks of {per_rank} each ({resources.strategy}) do not fit this Ray cluster: "
            f"{nodes} node(s) with {total} in total hold at most {most}; lower num_proc, cpus_per_rank or "
            "gpus_per_rank, or add nodes")


def wait_placement(ray: Any, pg: Any, bundles: list[dict[str, float]], resources: RayResources) -> None:
    """Wait until the placement group is scheduled.

    Raises:
        RendezvousError: not within ``placement_timeout``; names the bundles asked and the
            resources available and in total.
    """
    ready, _ = ray.wait([pg.ready()], timeout=resources.placement_timeout)
    if ready:
        ray.get(ready[0])
        return
    names = sorted({k for b in bundles for k in b})
    raise RendezvousError(
        f"the Ray placement group of {len(bundles)} bundle(s) of {bundles[0]} ({resources.strategy}) was not "
        f"scheduled within {resources.placement_timeout:g}s: the cluster has "
        f"{_relevant(ray.available_resources(), names)} available of {_relevant(ray.cluster_resources(), names)} "
        f"in total (other jobs hold the rest?); free resources, lower num_proc, or raise placement_timeout "
        f"({ENV_PLACEMENT_TIMEOUT})")


def _wait_ready(ray: Any, actors: list[Any], timeout: float) -> list[ActorInfo]:
    refs = [a.ready.remote() for a in actors]
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    if pending:
        missing = [i for i, r in enumerate(refs) if r not in ready]
        raise RendezvousError(f"Ray actor(s) {missing} of {len(actors)} did not start within {timeout:g}s "
                              "(start_timeout / HORA_START_TIMEOUT)")
    infos = []
    for i, ref in enumerate(refs):
        try:
            infos.append(ActorInfo(*ray.get(ref)))
        except Exception as exc:
            raise WorkerFailedError(f"the Ray actor of rank slot {i} died while starting: {_first_line(exc)}",
                                    rank=i) from None
    return infos


def _node_order(infos: Sequence[ActorInfo]) -> list[int]:
    first: dict[str, int] = {}
    for i, info in enumerate(infos):
        first.setdefault(info.node_id, i)
    return sorted(range(len(infos)), key=lambda i: (first[infos[i].node_id], i))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def service_addresses(ray: Any) -> tuple[str, str]:
    """``(bind, advertise)`` of the driver service: loopback when every Ray node is this
    driver's node or on a loopback address, else the driver node's IP."""
    override = os.environ.get(ENV_ADVERTISE_ADDR)
    if override:
        return ("127.0.0.1" if is_loopback(override) else "0.0.0.0", override)
    me = ray.get_runtime_context().get_node_id()
    nodes = _alive_nodes(ray)
    if all(n.get("NodeID") == me or is_loopback(n.get("NodeManagerAddress", "")) for n in nodes):
        return ("127.0.0.1", "127.0.0.1")
    return ("0.0.0.0", ray.util.get_node_ip_address())


class RayJob(Job):
    """One run's ranks as calls on a :class:`RayWorkerGroup`'s actors."""

    def __init__(self, spec: LaunchSpec, service: DriverService, *, make_group: Callable[[], RayWorkerGroup] | None,
                 group: RayWorkerGroup | None = None, loopback: bool = True) -> None:
        self.spec = spec
        self.service = service
        self._make_group = make_group
        self.group = group
        self.owns_group = group is None
        self.loopback = loopback
        self.refs: list[Any] = []
        self.contexts: list[RankContext] = []
        self._results: dict[int, Any] = {}
        self._failures: list[Failure] = []
        self._seen: set[int] = set()
        self._cancelled = False
        self.started = threading.Event()  # the rank calls are submitted (RayExecutor.run_remote)

    def start(self) -> None:
        if self.group is None:
            assert self._make_group is not None
            self.group = self._make_group()
        if self.group.stopped:
            raise ConfigError("the Ray workers were stopped (shutdown()); start them again")
        if self.group.num_proc != self.spec.num_proc:
            raise ConfigError(f"num_proc={self.spec.num_proc}, but the Ray worker group has {self.group.num_proc} actors")
        self.contexts = self.group.contexts(self.service.addr, self.loopback)
        self.refs = [a.run.remote(self.spec, ctx) for a, ctx in zip(self.group.actors, self.contexts)]
        self.started.set()

    def host_of(self, rank: int) -> str | None:
        return self.contexts[rank].hostname if 0 <= rank < len(self.contexts) else None

    def _check(self) -> None:
        if not self.refs:
            return
        ready, _ = self.group.ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        ready_set = set(ready)
        for rank, ref in enumerate(self.refs):
            if rank in self._seen or ref not in ready_set:
                continue
            self._seen.add(rank)
            try:
                self._results[rank] = self.group.ray.get(ref, timeout=0)
            except Exception as exc:
                if self._cancelled:
                    continue
                self._failures.append(self._failure(rank, exc))

    def _failure(self, rank: int, exc: BaseException) -> Failure:
        from ray.exceptions import RayActorError

        seq = self.service.next_seq()
        host = self.host_of(rank)
        cause = getattr(exc, "cause", None) or exc  # a RayTaskError carries the actor's exception
        if isinstance(cause, WorkerFailedError):
            return Failure(seq=seq, rank=rank, host=host, message=f"failed: {cause.message}",
                           traceback=cause.remote_traceback, exitcode=cause.exitcode)
        info = self.group.infos[rank] if self.group and rank < len(self.group.infos) else None
        where = f" (pid {info.pid} on node {info.node_ip}, id {info.node_id[:12]})" if info else ""
        if isinstance(exc, RayActorError):
            return Failure(seq=seq, rank=rank, host=host, message=f"was lost: its Ray actor{where} died: "
                                                                  f"{_first_line(exc)}")
        return Failure(seq=seq, rank=rank, host=host, message=f"failed in its Ray actor{where}: {_first_line(exc)}",
                       traceback=str(exc))

    def poll(self) -> list[Any] | None:
        self._check()
        if not self._failures and len(self._results) == len(self.refs) and self.refs:
            return [self._results[r] for r in range(len(self.refs))]
        return None

    def failures(self) -> list[Failure]:
        self._check()
        return list(self._failures)

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        if self.group is None:
            return
        pending = [r for i, r in enumerate(self.refs) if i not in self._seen]
        if self.owns_group:
            self.group.stop(pending)
            return
        # borrowed actors (RayExecutor): the driver's abort ends ranks still running; kill the rest
        if pending:
            grace = env_seconds(ENV_TERMINATE_GRACE, DEFAULT_TERMINATE_GRACE)
            _, still = self.group.ray.wait(pending, num_returns=len(pending), timeout=grace + 5)
            for rank, ref in enumerate(self.refs):
                if ref in still:
                    log.warning("rank %d of run %s did not stop at the abort; killing its Ray actor", rank,
                                self.spec.run_id)
                    with contextlib.suppress(Exception):
                        self.group.ray.kill(self.group.actors[rank], no_restart=True)


class RayLauncher(Launcher):
    """Ranks as Ray actors in a placement group (see the module docstring).

    Args:
        cpus_per_rank, gpus_per_rank, resources_per_rank, strategy: see :class:`RayResources`.
        placement_timeout: seconds for the placement group (default
            ``HORA_RAY_PLACEMENT_TIMEOUT`` or 100).
        workers: run on these existing actors instead (:class:`hora.ray.RayExecutor`'s);
            they outlive the run.
        placement_group: start the actors in this existing placement group (any bundle).

    Raises:
        ImportError: Ray is missing. ConfigError: a bad resource or strategy.
    """

    name = "ray"

    def __init__(self, *, cpus_per_rank: float = 1, gpus_per_rank: float = 0,
                 resources_per_rank: Mapping[str, float] | None = None, strategy: str = "PACK",
                 placement_timeout: float | None = None, workers: RayWorkerGroup | None = None,
                 placement_group: Any = None, ranks_per_bundle: int = 1) -> None:
        if placement_timeout is None:
            placement_timeout = env_seconds(ENV_PLACEMENT_TIMEOUT, DEFAULT_PLACEMENT_TIMEOUT)
        self.resources = RayResources(float(cpus_per_rank), float(gpus_per_rank),
                                      tuple(sorted((resources_per_rank or {}).items())), strategy,
                                      ranks_per_bundle, placement_timeout)
        self.workers = workers
        self.placement_group = placement_group
        self.ray = require_ray()
        self._addresses: tuple[str, str] | None = None
        self.last_job: RayJob | None = None

    def default_num_proc(self) -> int:
        if self.workers is not None:
            return self.workers.num_proc
        n = capacity(self.ray, self.resources)
        if n < 1:
            raise ConfigError(f"this Ray cluster cannot hold one rank of {self.resources.per_rank()}")
        return n

    def check_num_proc(self, num_proc: int) -> None:
        if self.workers is not None:
            if num_proc != self.workers.num_proc:
                raise ConfigError(f"num_proc={num_proc}, but the Ray worker group has {self.workers.num_proc} actors")
        elif self.placement_group is None:
            check_capacity(self.ray, num_proc, self.resources)

    def driver_addresses(self) -> tuple[str, str]:
        if self._addresses is None:
            self._addresses = service_addresses(self.ray)
        return self._addresses

    def start(self, spec: LaunchSpec, service: DriverService) -> Job:
        loopback = is_loopback(self.driver_addresses()[1])

        def make_group() -> RayWorkerGroup:
            return RayWorkerGroup.create(spec.num_proc, self.resources, start_timeout=spec.start_timeout,
                                         placement_group=self.placement_group)

        job = RayJob(spec, service, make_group=make_group, group=self.workers, loopback=loopback)
        self.last_job = job
        return start_or_cancel(job)


__all__ = ["RayLauncher", "RayJob", "RayWorkerGroup", "RayResources", "RankActor", "ActorInfo", "require_ray",
           "STRATEGIES", "ENV_PLACEMENT_TIMEOUT"]
