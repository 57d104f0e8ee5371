"""The environment contract between a launcher and its ranks, and a rank's place in the job.

A launcher gives every rank its place (:class:`Placement`: rank, size, local and cross
rank/size, host) and the job's rendezvous through ``HORA_*`` environment variables;
:class:`WorkerEnv` reads and writes them (its place is ``env.placement``).
:func:`compute_placement` derives local and cross ranks from the host of each rank.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from hora import settings
from hora.errors import ConfigError
from hora.settings import ENV_BACKEND  # gloo | nccl | mpi | auto (default auto)

ENV_RANK = "HORA_RANK"
ENV_SIZE = "HORA_SIZE"
ENV_LOCAL_RANK = "HORA_LOCAL_RANK"
ENV_LOCAL_SIZE = "HORA_LOCAL_SIZE"
ENV_CROSS_RANK = "HORA_CROSS_RANK"
ENV_CROSS_SIZE = "HORA_CROSS_SIZE"
ENV_RENDEZVOUS_ADDR = "HORA_RENDEZVOUS_ADDR"  # "host:port" of the RendezvousServer
ENV_SECRET = "HORA_SECRET"  # hex of the per-job secret
ENV_JOB_ID = "HORA_JOB_ID"
ENV_HOSTNAME = "HORA_HOSTNAME"  # address this worker advertises to its peers (gloo, ...)
ENV_START_TIMEOUT = "HORA_START_TIMEOUT"  # seconds to wait for every rank at start
ENV_RENDEZVOUS_TIMEOUT = "HORA_RENDEZVOUS_TIMEOUT"  # seconds for one key-value wait

DEFAULT_START_TIMEOUT = settings.default(ENV_START_TIMEOUT)
DEFAULT_RENDEZVOUS_TIMEOUT = settings.default(ENV_RENDEZVOUS_TIMEOUT)

def make_secret() -> bytes:
    """Return a fresh random per-job secret (32 bytes)."""
    return secrets.token_bytes(32)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one rank sits in the job: its rank of ``size``, its local rank/size among the
    ranks on its ``host`` and its cross rank/size across hosts (Horovod's definitions).
    The one type for a rank's place: :func:`compute_placement` makes it, a
    :class:`WorkerEnv` holds it (``env.placement``; :class:`Placed`)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    host: str


class Placed:
    """A type that holds a :class:`Placement` (``self.placement``) and reads its fields
    as its own: ``x.rank``, ``x.size``, ``x.local_rank``, ... (one type for a rank's place;
    :class:`WorkerEnv`, :class:`hora.runners.spec.RankContext` and
    :class:`hora.runners.slots.RankSlot` each hold one)."""

    placement: Placement

    @property
    def rank(self) -> int:
        return self.placement.rank

    @property
    def size(self) -> int:
        return self.placement.size

    @property
    def local_rank(self) -> int:
        return self.placement.local_rank

    @property
    def local_size(self) -> int:
        return self.placement.local_size

    @property
    def cross_rank(self) -> int:
        return self.placement.cross_rank

    @property
    def cross_size(self) -> int:
        return self.placement.cross_size


@dataclasses.dataclass(frozen=True)
class WorkerEnv(Placed):
    """Everything a worker learns from its launcher, as read from ``HORA_*`` variables: its
    place in the job (``placement``; its ``host`` is the address it advertises, ``hostname``)
    and the job's rendezvous."""

    placement: Placement
    rendezvous_addr: str
    secret: bytes = dataclasses.field(repr=False)
    job_id: str = "hora"
    backend: str = "auto"
    start_timeout: float = DEFAULT_START_TIMEOUT

    @property
    def hostname(self) -> str:
        """The address this worker advertises to its peers (``HORA_HOSTNAME``)."""
        return self.placement.host

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ConfigError(f"{ENV_SIZE} must be >= 1, got {self.size}")
        if not 0 <= self.rank < self.size:
            raise ConfigError(f"{ENV_RANK}={self.rank} is outside [0, {self.size})")
        if not 0 <= self.local_rank < self.local_size:
            raise ConfigError(f"{ENV_LOCAL_RANK}={self.local_rank} is outside [0, {self.local_size})")
        if not 0 <= self.cross_rank < self.cross_size:
            raise ConfigError(f"{ENV_CROSS_RANK}={self.cross_rank} is outside [0, {self.cross_size})")
        if self.backend not in settings.BACKENDS:
            raise ConfigError(f"{ENV_BACKEND}={self.backend!r} is unknown; use one of {', '.join(settings.BACKENDS)}")
        if self.start_timeout <= 0:
            raise ConfigError(f"{ENV_START_TIMEOUT} must be > 0, got {self.start_timeout}")
        if ":" not in self.rendezvous_addr:
            raise ConfigError(f"{ENV_RENDEZVOUS_ADDR}={self.rendezvous_addr!r} is not host:port")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv:
        """Read the contract from ``environ`` (default ``os.environ``).

        Raises:
            ConfigError: a required variable is missing or malformed.
        """
        env = os.environ if environ is None else environ
        missing = [k for k in (ENV_RANK, ENV_SIZE, ENV_RENDEZVOUS_ADDR, ENV_SECRET) if not env.get(k)]
        if missing:
            raise ConfigError(
                "this process was not started by a hora launcher: missing environment "
                f"variable(s) {', '.join(missing)} (use `hora run`, hora.runners.run, or set them)"
            )

        def get(name: str) -> Any:
            return settings.get(name, env)

        rank, size = get(ENV_RANK), get(ENV_SIZE)
        try:
            secret = bytes.fromhex(env[ENV_SECRET])
        except ValueError:
            raise ConfigError(f"{ENV_SECRET} is not hex") from None
        local_rank, local_size = get(ENV_LOCAL_RANK), get(ENV_LOCAL_SIZE)
        placement = Placement(
            rank=rank,
            size=size,
            local_rank=rank if local_rank is None else local_rank,
            local_size=size if local_size is None else local_size,
            cross_rank=get(ENV_CROSS_RANK),
            cross_size=get(ENV_CROSS_SIZE),
            host=get(ENV_HOSTNAME) or settings.default(ENV_HOSTNAME),
        )
        return cls(
            placement=placement,
            rendezvous_addr=env[ENV_RENDEZVOUS_ADDR],
            secret=secret,
            job_id=get(ENV_JOB_ID) or settings.default(ENV_JOB_ID),
            backend=get(ENV_BACKEND),
            start_timeout=get(ENV_START_TIMEOUT),
        )

    @classmethod
    def local(cls, rank: int, size: int, rendezvous_addr: str, secret: bytes, host: str = "127.0.0.1",
              **rest: Any) -> WorkerEnv:
        """The contract of rank ``rank`` of ``size`` ranks all on one host (local rank = rank, one
        cross rank); ``rest``: job_id, backend, start_timeout."""
        placement = Placement(rank=rank, size=size, local_rank=rank, local_size=size, cross_rank=0, cross_size=1,
                              host=host)
        return cls(placement=placement, rendezvous_addr=rendezvous_addr, secret=secret, **rest)

    def to_environ(self) -> dict[str, str]:
        """The ``HORA_*`` variables that make :meth:`from_environ` return this object."""
        return {
            ENV_RANK: str(self.rank),
            ENV_SIZE: str(self.size),
            ENV_LOCAL_RANK: str(self.local_rank),
            ENV_LOCAL_SIZE: str(self.local_size),
            ENV_CROSS_RANK: str(self.cross_rank),
            ENV_CROSS_SIZE: str(self.cross_size),
            ENV_RENDEZVOUS_ADDR: self.rendezvous_addr,
            ENV_SECRET: self.secret.hex(),
            ENV_JOB_ID: self.job_id,
            ENV_HOSTNAME: self.hostname,
            ENV_BACKEND: self.backend,
            ENV_START_TIMEOUT: str(self.start_timeout),
        }


def compute_placement(hosts: Sequence[str]) -> list[Placement]:
    """Derive local and cross ranks from the host of each rank (index = rank).

    ``local_rank`` counts the ranks before this one on the same host; ``cross_rank`` is the
    index of this host among the hosts that have a rank with the same ``local_rank``
    (Horovod's definition), in order of first appearance.
    """
    per_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        per_host.setdefault(host, []).append(rank)
    out = []
    for rank, host in enumerate(hosts):
        local_rank = per_host[host].index(rank)
        peers = [h for h, ranks in per_host.items() if len(ranks) > local_rank]
        out.append(
            Placement(
                rank=rank,
                size=len(hosts),
                host=host,
                local_rank=local_rank,
                local_size=len(per_host[host]),
                cross_rank=peers.index(host),
                cross_size=len(peers),
            )
        )
    return out


__all__ = [
    "DEFAULT_RENDEZVOUS_TIMEOUT", "DEFAULT_START_TIMEOUT", "ENV_BACKEND", "ENV_CROSS_RANK", "ENV_CROSS_SIZE",
    "ENV_HOSTNAME", "ENV_JOB_ID", "ENV_LOCAL_RANK", "ENV_LOCAL_SIZE", "ENV_RANK", "ENV_RENDEZVOUS_ADDR",
    "ENV_RENDEZVOUS_TIMEOUT", "ENV_SECRET", "ENV_SIZE", "ENV_START_TIMEOUT", "Placed", "Placement", "WorkerEnv",
    "compute_placement", "make_secret",
]
