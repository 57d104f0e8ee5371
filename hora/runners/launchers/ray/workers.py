"""The Ray actors that run ranks: :class:`RankActor` (one rank's dedicated worker
process) and :class:`RayWorkerGroup` (one actor per rank in one placement group, in rank
order: the ranks of one node contiguous, nodes in the order of their first bundle).

A rank runs in its actor's own process (:func:`hora.runners.rank.main.run_rank`), so Ray's
GPU assignment (``CUDA_VISIBLE_DEVICES``) is the rank's and objects can stay in the actor
between runs (:class:`hora.ray.RayExecutor`'s executable). While a run is on, the
actor's Python output goes to the run's driver service; its value comes back through
Ray's object store.
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

from hora.errors import RendezvousError, WorkerFailedError
from hora.native.rendezvous import KVClient, compute_placement
from hora.runners.launchers.ray.placement import RayResources, check_capacity, require_ray, wait_placement
from hora.runners.network import is_loopback
from hora.runners.spec import LaunchSpec, RankContext

log = logging.getLogger(__name__)

STOP_TIMEOUT = 15.0  # seconds for killed actors to be confirmed dead


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
        from hora.runners.rank.procs import describe_exit, last_traceback
        from hora.runners.rank.main import run_rank
        from hora.runners.rank.supervise import _LogPusher, read_result

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
            code = run_rank(spec, ctx, path)  # it stops its heartbeat thread however the rank ends
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
        return [RankContext(placement=dataclasses.replace(p, size=n, host=hosts[p.rank]), rendezvous_addr=rendezvous_addr)
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
            raise WorkerFailedError(f"the Ray actor of rank slot {i} died while starting: {first_line(exc)}",
                                    rank=i) from None
    return infos


def _node_order(infos: Sequence[ActorInfo]) -> list[int]:
    first: dict[str, int] = {}
    for i, info in enumerate(infos):
        first.setdefault(info.node_id, i)
    return sorted(range(len(infos)), key=lambda i: (first[infos[i].node_id], i))


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


__all__ = ["RankActor", "RayWorkerGroup", "ActorInfo", "first_line", "STOP_TIMEOUT"]
