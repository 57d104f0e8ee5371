"""Dask launcher: one pinned ``client.submit`` per rank on distinct workers.

Rank ``r`` runs on worker ``addr`` with ``workers=[addr]``, ``allow_other_workers=False``,
``pure=False`` and the key ``hora-<run_id>-rank<r>`` (so the dashboard names it). Where
workers declare a ``GPU`` resource, only those are used and each task asks for
``resources={"GPU": 1}``. The rendezvous is the driver service (bound to port 0 and then
published: no port race). Each task runs its rank as a subprocess through
:func:`hora.runners.rank.supervise.supervise`; a worker that dies or leaves fails the run (a
lost worker: with ``max_failures`` the run is relaunched on the workers left, never on a
lost worker's address again).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from hora import settings
from hora.errors import ConfigError, WorkerFailedError
from hora.native.rendezvous import compute_placement
from hora.runners.launcher import Job, Launcher
from hora.runners.driver.service import DriverService
from hora.runners.driver.faults import FaultKind
from hora.runners.driver.monitor import Failure
from hora.runners.spec import (
    ENV_ADVERTISE_ADDR,
    ENV_TERMINATE_GRACE,
    LaunchSpec,
    RankContext,
)

log = logging.getLogger(__name__)

WORKER_CHECK_INTERVAL = 1.0


def _dask_task(spec: LaunchSpec, ctx: RankContext) -> Any:
    """The body of one rank's Dask task."""
    from hora.runners.rank.supervise import supervise

    return supervise(spec, ctx)


def _host_of(address: str) -> str:
    host = urlparse(address).hostname if "://" in address else address.rsplit(":", 1)[0]
    return host or "127.0.0.1"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def task_key(spec: LaunchSpec, rank: int) -> str:
    """The Dask key of a rank's task: ``hora-<run_id>-rank<r>``, ``hora-<run_id>-a<k>-rank<r>``
    for the k-th attempt of a relaunched run (a key is never reused)."""
    attempt = "" if spec.attempt == 1 else f"-a{spec.attempt}"
    return f"hora-{spec.run_id}{attempt}-rank{rank}"


def _kind_of_task_error(exc: BaseException) -> FaultKind:
    """A Dask task error that is not hora's: ``KilledWorker`` (the worker died running it) is a lost worker."""
    return FaultKind.LOST if type(exc).__name__ == "KilledWorker" else FaultKind.TASK


class DaskJob(Job):
    """The pinned futures of one run."""

    def __init__(self, launcher: DaskLauncher, spec: LaunchSpec, service: DriverService) -> None:
        self.client = launcher.client
        self.launcher = launcher
        self.spec = spec
        self.service = service
        self._failed: set[int] = set()
        self._failures: list[Failure] = []
        workers = launcher.pick_workers(spec.num_proc)
        self.addresses = [addr for addr, _ in workers]
        hosts = [launcher.advertise_for(info.get("host") or _host_of(addr)) for addr, info in workers]
        self.hosts = hosts
        self._cancelled = False
        self._last_check = 0.0
        self.futures = []
        try:
            for p in compute_placement(hosts):
                addr, info = workers[p.rank]
                ctx = RankContext(placement=dataclasses.replace(p, size=spec.num_proc), rendezvous_addr=service.addr)
                resources = {"GPU": 1} if (info.get("resources") or {}).get("GPU") else None
                self.futures.append(
                    self.client.submit(
                        _dask_task, spec, ctx,
                        key=task_key(spec, p.rank),
                        workers=[addr], allow_other_workers=False, pure=False, resources=resources,
                    )
                )
        except BaseException:
            self.cancel()
            raise

    def failures(self) -> list[Failure]:
        """Failed futures and lost workers, each numbered once, when first seen."""
        for rank, fut in enumerate(self.futures):
            if rank in self._failed:
                continue
            status = fut.status
            if status == "error":
                exc = fut.exception()
                if isinstance(exc, WorkerFailedError):  # supervise()'s account; the rank's own report has more
                    code = exc.exitcode
                    self._fail(rank, Failure(seq=self.service.next_seq(), rank=rank, host=self.hosts[rank],
                                             message=exc.message.removeprefix(f"rank {rank} "),
                                             traceback=exc.remote_traceback, exitcode=code,
                                             kind=FaultKind.SIGNAL if (code or 0) < 0 else FaultKind.TASK,
                                             source="engine"))
                else:
                    self._fail(rank, Failure(seq=self.service.next_seq(), rank=rank, host=self.hosts[rank],
                                             message=f"failed on Dask worker {self.addresses[rank]}: "
                                                     f"{type(exc).__name__}: {exc}",
                                             kind=_kind_of_task_error(exc), source="engine"))
            elif status in ("cancelled", "lost"):
                self._fail(rank, Failure.lost(self.service.next_seq(), rank, self.hosts[rank],
                                              f"was lost: its Dask task on {self.addresses[rank]} was {status}"))
        now = time.monotonic()
        if now - self._last_check >= WORKER_CHECK_INTERVAL and len(self._failed) < len(self.futures):
            self._last_check = now
            alive = set(worker_infos(self.client))
            for rank, (addr, fut) in enumerate(zip(self.addresses, self.futures)):
                if rank not in self._failed and addr not in alive and fut.status != "finished":
                    self.launcher.lost_workers.add(addr)
                    self._fail(rank, Failure.lost(self.service.next_seq(), rank, self.hosts[rank],
                                                  f"was lost: Dask worker {addr} died or left the cluster"))
        return list(self._failures)

    def _fail(self, rank: int, failure: Failure) -> None:
        self._failed.add(rank)
        self._failures.append(failure)

    def poll(self) -> list[Any] | None:
        if self._failed or not all(f.status == "finished" for f in self.futures):
            return None
        return [f.result() for f in self.futures]

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        pending = [f for f in self.futures if f.status == "pending"]
        if pending:
            try:
                self.client.cancel(pending, force=True)
            except Exception as exc:
                log.warning("could not cancel the Dask tasks of run %s: %s", self.spec.run_id, exc)
        grace = float(settings.get(ENV_TERMINATE_GRACE))
        # a lost worker took its supervisor along (and its rank: PR_SET_PDEATHSIG): nobody is left to confirm
        lost = {r for r, addr in enumerate(self.addresses) if addr in self.launcher.lost_workers}
        started = set(self.service.started()) - lost
        left = self.service.wait_exited(started, grace + 5)
        if left:
            log.warning("rank(s) %s of run %s did not confirm that their processes stopped", sorted(left), self.spec.run_id)


class DaskLauncher(Launcher):
    """Ranks as Dask tasks pinned one per worker.

    Args:
        client: a ``distributed.Client`` (default: the active one).

    Raises:
        ConfigError: no client is active and none was given.
    """

    name = "dask"

    def __init__(self, client: Any = None) -> None:
        if client is None:
            from distributed import get_client

            try:
                client = get_client()
            except ValueError:
                raise ConfigError("backend='dask' needs a distributed.Client: create one or pass client=") from None
        self.client = client
        self.lost_workers: set[str] = set()  # never used again (a restarted worker has a new address)

    def _workers(self) -> dict[str, dict[str, Any]]:
        return worker_infos(self.client)

    def _candidates(self) -> list[tuple[str, dict[str, Any]]]:
        workers = sorted(((a, i) for a, i in self._workers().items() if a not in self.lost_workers),
                         key=lambda kv: (kv[1].get("host", ""), kv[0]))
        with_gpu = [(a, i) for a, i in workers if (i.get("resources") or {}).get("GPU")]
        return with_gpu or workers

    def default_num_proc(self) -> int:
        n = len(self._candidates())
        if n == 0:
            raise ConfigError("the Dask cluster has no workers")
        return n

    def check_num_proc(self, num_proc: int) -> None:
        n = len(self._candidates())
        if num_proc > n:
            raise ConfigError(
                f"num_proc={num_proc} needs {num_proc} distinct Dask workers (one rank per worker), but the "
                f"cluster at {self.client.scheduler.address} has {n}; lower num_proc or add workers"
            )

    def pick_workers(self, num_proc: int) -> list[tuple[str, dict[str, Any]]]:
        """The workers ranks 0..num_proc-1 run on, grouped by host."""
        self.check_num_proc(num_proc)
        return self._candidates()[:num_proc]

    def _scheduler_host(self) -> str:
        return _host_of(self.client.scheduler.address)

    def advertise_for(self, worker_host: str) -> str:
        """The address a rank on ``worker_host`` advertises."""
        override = os.environ.get(ENV_ADVERTISE_ADDR)
        if override and _is_loopback(worker_host):
            return override
        return "127.0.0.1" if _is_loopback(worker_host) else worker_host

    def driver_addresses(self) -> tuple[str, str]:
        override = os.environ.get(ENV_ADVERTISE_ADDR)
        if override:
            return ("127.0.0.1" if _is_loopback(override) else "0.0.0.0", override)
        host = self._scheduler_host()
        if _is_loopback(host):
            return ("127.0.0.1", "127.0.0.1")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # the address facing the scheduler
            s.connect((host, 9))
            return ("0.0.0.0", s.getsockname()[0])

    def prestart(self, num_proc: int, env: Mapping[str, str]) -> None:
        """Start the warm rank servers of the workers the ranks will run on
        (:func:`hora.runners.rank.supervise.prestart_rank_server`, through ``Client.run`` on a
        background thread): they import torch while the fit checks and materializes its data."""
        from hora.runners.rank.warm import client as warm
        from hora.runners.rank.supervise import prestart_rank_server

        if not warm.enabled({**os.environ, **env}):
            return

        def run() -> None:
            try:
                addrs = [a for a, _ in self.pick_workers(num_proc)]
                self.client.run(prestart_rank_server, dict(env), workers=addrs)
            except Exception as exc:  # the ranks then start their servers themselves
                log.debug("could not start the warm rank servers ahead of the ranks: %s", exc)

        threading.Thread(target=run, name="hora-dask-prestart", daemon=True).start()

    def start(self, spec: LaunchSpec, service: DriverService) -> Job:
        return DaskJob(self, spec, service)


# a worker whose `import hora` finds a folder named hora (e.g. a store path) instead of the package
# fails every task at unpickling ("cannot import name ... from 'hora' (unknown location)"): this
# probe is defined from source so cloudpickle ships it by value and the worker needs no hora to run it
_IMPORT_PROBE_SOURCE = """
def probe():
    import importlib.util, os, sys
    try:
        spec = importlib.util.find_spec("hora")
    except Exception as exc:
        return {"python": sys.executable, "cwd": os.getcwd(), "error": type(exc).__name__ + ": " + str(exc)}
    if spec is None:
        return {"python": sys.executable, "cwd": os.getcwd(), "error": "No module named 'hora'"}
    return {"python": sys.executable, "cwd": os.getcwd(), "origin": spec.origin,
            "folders": list(spec.submodule_search_locations or [])}
"""


def check_workers_import_hora(client: Any, timeout: float = 60.0) -> None:
    """Check that every worker of ``client`` imports hora as the installed package.

    Runs one tiny task per worker that needs nothing from hora (``importlib.util.find_spec``).

    Raises:
        ConfigError: a worker's ``hora`` is a namespace folder (naming the worker and the
            folder) or missing (naming the worker's interpreter), or the workers did not
            answer within ``timeout`` seconds.
    """
    from distributed import wait

    namespace: dict[str, Any] = {"__name__": "hora_dask_worker_probe"}
    exec(_IMPORT_PROBE_SOURCE, namespace)  # noqa: S102 - our own constant source
    workers = list(worker_infos(client))
    futures = {addr: client.submit(namespace["probe"], workers=[addr], allow_other_workers=False, pure=False,
                                   key=f"hora-probe-{addr}-{time.monotonic_ns()}") for addr in workers}
    done, not_done = wait(list(futures.values()), timeout=timeout)
    if not_done:
        client.cancel(list(not_done))
        raise ConfigError(f"{len(not_done)} Dask worker(s) did not answer hora's import check within {timeout:.0f}s")
    problems = []
    for addr, fut in futures.items():
        seen = fut.result()
        if seen.get("error"):
            problems.append(f"worker {addr} runs {seen['python']}, which cannot import hora ({seen['error']})")
        elif seen.get("origin") is None:
            folders = ", ".join(dict.fromkeys(seen.get("folders") or [])) or "(unknown)"
            problems.append(f"on worker {addr} (cwd {seen['cwd']}), 'import hora' finds the folder {folders}, a "
                            "namespace package (a folder named hora without __init__.py, e.g. a store path such as "
                            "file:///tmp/hora, in the working directory or next to the script) instead of the "
                            "installed hora")
    if problems:
        raise ConfigError("; ".join(problems) + ": rename that folder, or start the script and the workers from "
                          "another directory")


def worker_infos(client: Any) -> dict[str, dict[str, Any]]:
    """``{address: info}`` of the scheduler's workers, asked of the scheduler now.

    Not ``client.scheduler_info()["workers"]``: that call stores the identity it fetched on the
    client and returns the stored one, which the client's own periodic refresh (every
    ``distributed.client.scheduler-info-interval``, 2 s, asking for no workers: ``n_workers=0``)
    can replace in between. A run then saw every worker gone ("Dask worker ... died or left the
    cluster") a second after it started, at random, more often on a loaded machine."""
    if _takes_n_workers(client):
        identity = client.sync(client.scheduler.identity, n_workers=-1)
    else:  # distributed before n_workers: the identity lists every worker
        identity = client.sync(client.scheduler.identity)
    return dict(identity.get("workers") or {})


def _takes_n_workers(client: Any) -> bool:
    import inspect

    try:
        return "n_workers" in inspect.signature(client.scheduler_info).parameters
    except (TypeError, ValueError):
        return False


__all__ = ["DaskLauncher", "DaskJob", "check_workers_import_hora"]
