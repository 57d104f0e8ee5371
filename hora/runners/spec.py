"""What every worker needs to run one rank: a frozen, picklable :class:`LaunchSpec`.

The driver builds one ``LaunchSpec`` per run; each launcher adds a small per-rank
:class:`RankContext` (the rank's place in the job and where the rendezvous is) and
hands both to the one worker entry point, :mod:`hora.runners.rank.main`.

The per-job secret travels *inside* the pickled spec, never as a visible string:
``repr()`` of a spec shows neither the secret nor the pickled function, so it cannot
leak through logs, the Spark UI or the Dask dashboard.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from hora import settings
from hora.settings import (  # the native engine's settings a run sets (read by hora.native)
    ENV_AUTOTUNE,
    ENV_CACHE_CAPACITY,
    ENV_CYCLE_TIME,
    ENV_FUSION_THRESHOLD,
    ENV_SHM_ALLREDUCE,
    ENV_TIMELINE,
    ENV_TIMELINE_MARK_CYCLES,
)
from hora.errors import ConfigError
from hora.native.rendezvous import tls as _tls
from hora.native.rendezvous.contract import Placed, Placement
from hora.native.rendezvous.tls import JobCertificate
from hora.names import check_run_id, new_run_id  # the one run id rule (store folders, job tags, task keys)

# --------------------------------------------------------------------------------------
# Environment variables (beyond the rendezvous contract in hora.native.rendezvous)
# --------------------------------------------------------------------------------------
ENV_DRIVER_ADDR = "HORA_DRIVER_ADDR"  # "host:port" of the driver service (logs, metrics, failures)
ENV_RUN_ID = "HORA_RUN_ID"
ENV_ADVERTISE_ADDR = "HORA_ADVERTISE_ADDR"  # override the address workers advertise (real clusters)
ENV_HEARTBEAT_TIMEOUT = "HORA_HEARTBEAT_TIMEOUT"  # seconds without a heartbeat before a rank is dead
ENV_FINISH_TIMEOUT = "HORA_FINISH_TIMEOUT"  # seconds the other ranks get once one rank returned
ENV_TERMINATE_GRACE = "HORA_TERMINATE_GRACE"  # seconds between SIGTERM and SIGKILL
ENV_NETWORK_INTERFACE = "HORA_NETWORK_INTERFACE"  # ranks advertise this interface's address (Gloo/NCCL use it)
ENV_WORKER_PYTHON = "HORA_WORKER_PYTHON"  # the interpreter Spark/Dask task supervisors start ranks with
ENV_SUPERVISOR_PID = "HORA_SUPERVISOR_PID"  # set in every rank: the process supervising it (it ends with it)
ENV_ATTEMPT = "HORA_ATTEMPT"  # set in every rank: 1 for the first launch, 2 for the first relaunch, ...
ENV_ROOT_CAUSE_GRACE = "HORA_ROOT_CAUSE_GRACE"  # seconds to wait for a lost rank behind a survivor's error


DEFAULT_HEARTBEAT_TIMEOUT = settings.default(ENV_HEARTBEAT_TIMEOUT)
DEFAULT_FINISH_TIMEOUT = settings.default(ENV_FINISH_TIMEOUT)
DEFAULT_TERMINATE_GRACE = settings.default(ENV_TERMINATE_GRACE)
DEFAULT_ROOT_CAUSE_GRACE = settings.default(ENV_ROOT_CAUSE_GRACE)
HEARTBEAT_INTERVAL = 1.0

# the keys ranks and launchers exchange are in hora.native.keys (one module owns them)

def native_settings_env(
    *,
    timeline: str | None = None,
    timeline_mark_cycles: bool = False,
    cycle_time_ms: float | None = None,
    fusion_threshold_mb: float | None = None,
    cache_capacity: int | None = None,
    autotune: bool = False,
    shm: bool = True,
) -> dict[str, str]:
    """The ``HORA_*`` variables that tell the native engine its settings (``shm=False``:
    ranks on one host allreduce through Gloo, not shared memory).

    Raises:
        ConfigError: a value is out of range (named in the message).
    """
    out: dict[str, str] = {}
    if timeline:
        out[ENV_TIMELINE] = os.path.abspath(timeline)
        if timeline_mark_cycles:
            out[ENV_TIMELINE_MARK_CYCLES] = "1"
    if cycle_time_ms is not None:
        if cycle_time_ms <= 0:
            raise ConfigError(f"cycle time must be > 0 ms, got {cycle_time_ms}")
        out[ENV_CYCLE_TIME] = f"{cycle_time_ms:g}"
    if fusion_threshold_mb is not None:
        if fusion_threshold_mb < 0:
            raise ConfigError(f"fusion threshold must be >= 0 MB, got {fusion_threshold_mb}")
        out[ENV_FUSION_THRESHOLD] = str(int(fusion_threshold_mb * 1024 * 1024))
    if cache_capacity is not None:
        if cache_capacity < 0:
            raise ConfigError(f"cache capacity must be >= 0, got {cache_capacity}")
        out[ENV_CACHE_CAPACITY] = str(int(cache_capacity))
    if autotune:
        out[ENV_AUTOTUNE] = "1"
    if not shm:
        out[ENV_SHM_ALLREDUCE] = "0"
    return out


def _check_env(env: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    if env is None:
        return ()
    if not isinstance(env, Mapping):
        raise ConfigError(f"env must be a mapping of str to str, got {type(env).__name__}")
    out = []
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key:
            raise ConfigError(f"env key {key!r} is not a valid environment variable name")
        if not isinstance(value, str):
            raise ConfigError(f"env[{key!r}] must be a str, got {type(value).__name__}")
        out.append((key, value))
    return tuple(sorted(out))


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """Everything every rank of one run needs (frozen, picklable, secret-free ``repr``).

    Attributes:
        payload: ``cloudpickle.dumps((fn, args, kwargs))``.
        fn_name: the function's qualified name, for messages.
        num_proc: the number of ranks.
        run_id: names the run (task keys, Spark job group, store folders).
        secret: the per-job secret authenticating every message (hidden from ``repr``).
        driver_addr: ``host:port`` of the driver service (logs, metrics, failures, abort).
        env: extra environment variables for every rank, as sorted ``(key, value)`` pairs.
        start_timeout: seconds every rank has to start.
        collective_backend: ``auto``, ``gloo``, ``nccl`` or ``mpi`` (``HORA_BACKEND``).
        verbose: 0 quiet, 1 normal, 2 debug logging in the workers.
        init_native: call ``hora.native.init()`` before and ``shutdown()`` after ``fn``.
        sys_path: the driver's ``sys.path``; entries missing in a worker are added, so
            functions from the driver's modules unpickle there.
        attempt: which launch of the run this is (1 = the first; a relaunch after a lost
            rank counts up); ranks see it as ``HORA_ATTEMPT``.
        beat_interval: seconds between two heartbeats of each rank (default ``HEARTBEAT_INTERVAL``);
            a launcher whose proof that a lost rank stopped is that rank's silence asks for
            shorter ones (Spark: 0.25 s).
        tls: the attempt's TLS certificate with its key (hidden from ``repr``; None: plaintext):
            the driver service and the rendezvous servers present it, every client pins it
            (:mod:`hora.native.rendezvous.tls`). Building or unpickling a spec files it under ``secret``.
    """

    payload: bytes = dataclasses.field(repr=False)
    fn_name: str
    num_proc: int
    run_id: str
    secret: bytes = dataclasses.field(repr=False)
    driver_addr: str
    env: tuple[tuple[str, str], ...] = ()
    start_timeout: float = 60.0
    collective_backend: str = "auto"
    verbose: int = 1
    init_native: bool = True
    sys_path: tuple[str, ...] = ()
    attempt: int = 1
    beat_interval: float = HEARTBEAT_INTERVAL
    tls: JobCertificate | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.num_proc, bool) or not isinstance(self.num_proc, int) or self.num_proc < 1:
            raise ConfigError(f"num_proc must be an int >= 1, got {self.num_proc!r}")
        if isinstance(self.attempt, bool) or not isinstance(self.attempt, int) or self.attempt < 1:
            raise ConfigError(f"attempt must be an int >= 1, got {self.attempt!r}")
        check_run_id(self.run_id)
        if not isinstance(self.secret, bytes) or len(self.secret) < 16:
            raise ConfigError("the job secret must be at least 16 bytes")
        if ":" not in self.driver_addr:
            raise ConfigError(f"driver address {self.driver_addr!r} is not host:port")
        if not 0 < self.beat_interval <= HEARTBEAT_INTERVAL:
            raise ConfigError(f"beat_interval must be > 0 and <= {HEARTBEAT_INTERVAL} s, got {self.beat_interval!r}")
        if not self.start_timeout > 0:
            raise ConfigError(f"start_timeout must be > 0 seconds, got {self.start_timeout!r}")
        if self.collective_backend not in settings.BACKENDS:
            raise ConfigError(
                f"collective backend {self.collective_backend!r} is unknown; use one of auto, gloo, nccl, mpi"
            )
        object.__setattr__(self, "env", _check_env(dict(self.env)))
        if self.tls is not None and not isinstance(self.tls, JobCertificate):
            raise ConfigError(f"tls must be a JobCertificate, got {type(self.tls).__name__}")
        _tls.register(self.secret, self.tls)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a spec unpickled in a rank, a task supervisor or a Spark task files its job's TLS
        # certificate under the job's secret: every connection of the job is TLS from then on
        self.__dict__.update(state)
        _tls.register(self.secret, self.tls)

    @property
    def env_dict(self) -> dict[str, str]:
        """The extra environment as a dict."""
        return dict(self.env)


@dataclasses.dataclass(frozen=True)
class RankContext(Placed):
    """One rank's place in the job, added by the launcher that starts it.

    Attributes:
        placement: its rank, size, local and cross rank/size (as in Horovod; read as
            ``ctx.rank``, ``ctx.local_size``, ...), and as ``host`` the address this rank
            advertises to its peers (``HORA_HOSTNAME``, ``ctx.hostname``).
        rendezvous_addr: ``host:port`` of the collective rendezvous server.
        extra_env: per-rank variables (e.g. ``CUDA_VISIBLE_DEVICES``), sorted pairs.
    """

    placement: Placement
    rendezvous_addr: str
    extra_env: tuple[tuple[str, str], ...] = ()

    @property
    def hostname(self) -> str:
        return self.placement.host


@dataclasses.dataclass(frozen=True)
class FailureReport:
    """What a failing rank posts to the driver before it exits.

    Attributes:
        seq: its number from the failure counter (lower = earlier).
        rank, host: who failed.
        error: ``"TypeName: message"`` of the exception.
        traceback: the rank's traceback (or its last stderr lines).
        exitcode: the exit code the rank's process ends (or ended) with.
        error_types: the qualified names of the exception's classes (its MRO), so the
            driver can tell a collective failure from an error of the user's code.
        died: posted by a task supervisor for a rank process that died without reporting
            (killed by a signal, or ``os._exit``): ``exitcode`` tells how.
    """

    seq: int
    rank: int
    host: str
    error: str
    traceback: str
    exitcode: int | None = None
    error_types: tuple[str, ...] = ()
    died: bool = False


def dumps(obj: Any) -> bytes:
    """cloudpickle ``obj`` (functions defined in ``__main__`` or notebooks travel by value)."""
    import cloudpickle

    return cloudpickle.dumps(obj)


__all__ = [
    "LaunchSpec",
    "RankContext",
    "FailureReport",
    "new_run_id",
    "check_run_id",
    "native_settings_env",
]
