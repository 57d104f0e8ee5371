"""Local backend: one process per rank on this machine (the same code path as ``hora run``).

Each rank is ``python -m hora.runners.worker`` started by the shared
:class:`~hora.runners.procs.ProcessLauncher` in its own process group, with the spec on
its stdin. Every rank advertises 127.0.0.1 (``HORA_ADVERTISE_ADDR`` overrides).
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import tempfile
from typing import Any

from hora.errors import WorkerFailedError
from hora.native.rendezvous import compute_placement
from hora.runners.base import Backend, Job
from hora.runners.driver import DriverService
from hora.runners.procs import ProcessLauncher, describe_exit
from hora.runners.spec import (
    DEFAULT_TERMINATE_GRACE,
    ENV_ADVERTISE_ADDR,
    ENV_TERMINATE_GRACE,
    LaunchSpec,
    RankContext,
    env_seconds,
)
from hora.runners.worker import read_result, worker_argv, worker_process_env

log = logging.getLogger(__name__)


class LocalJob(Job):
    """Rank processes on this machine."""

    def __init__(self, spec: LaunchSpec, service: DriverService, hostname: str) -> None:
        self.spec = spec
        self.hostname = hostname
        self.grace = env_seconds(ENV_TERMINATE_GRACE, DEFAULT_TERMINATE_GRACE)
        self.tmpdir = tempfile.mkdtemp(prefix=f"hora-{spec.run_id}-")
        os.chmod(self.tmpdir, 0o700)
        self.launcher = ProcessLauncher(service.emit)
        self.result_paths = [os.path.join(self.tmpdir, f"rank.{r}.pkl") for r in range(spec.num_proc)]
        self._cancelled = False
        try:
            for p in compute_placement([hostname] * spec.num_proc):
                ctx = RankContext(
                    rank=p.rank, size=spec.num_proc, local_rank=p.local_rank, local_size=p.local_size,
                    cross_rank=p.cross_rank, cross_size=p.cross_size, hostname=hostname,
                    rendezvous_addr=service.addr,
                )
                self.launcher.start(
                    p.rank, worker_argv(self.result_paths[p.rank]), worker_process_env(),
                    stdin_data=pickle.dumps((spec, ctx)),
                )
        except BaseException:
            self.cancel()
            raise

    def pid(self, rank: int) -> int:
        """The process id of a rank."""
        return self.launcher.pid(rank)

    def poll(self) -> list[Any] | None:
        codes = self.launcher.poll()
        failed = sorted((r, c) for r, c in codes.items() if c not in (0, None))
        if failed:
            rank, code = failed[0]
            self.launcher.wait_output(rank, timeout=2.0)
            raise WorkerFailedError(
                f"rank {rank} on {self.hostname} failed with {describe_exit(code)}",
                rank=rank, host=self.hostname, remote_traceback=self.launcher.traceback_of(rank), exitcode=code,
            )
        if all(c == 0 for c in codes.values()) and len(codes) == self.spec.num_proc:
            for r in codes:
                self.launcher.wait_output(r, timeout=5.0)
            return [read_result(p) for p in self.result_paths]
        return None

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        self.launcher.terminate(self.grace)
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def host_of(self, rank: int) -> str | None:
        return self.hostname


class LocalBackend(Backend):
    """Ranks as processes on this machine.

    Args:
        hostname: the address ranks advertise (default ``HORA_ADVERTISE_ADDR`` or 127.0.0.1).
    """

    name = "local"

    def __init__(self, hostname: str | None = None) -> None:
        self.hostname = hostname or os.environ.get(ENV_ADVERTISE_ADDR) or "127.0.0.1"

    def default_num_proc(self) -> int:
        return os.cpu_count() or 1

    def driver_addresses(self) -> tuple[str, str]:
        return ("127.0.0.1" if self.hostname.startswith("127.") else "0.0.0.0", self.hostname)

    def start(self, spec: LaunchSpec, service: DriverService) -> Job:
        return LocalJob(spec, service, self.hostname)


__all__ = ["LocalBackend", "LocalJob"]
