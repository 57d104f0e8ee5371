"""The worker's side of elastic ``hora run`` (``--host-discovery-script``): rounds of membership.

An elastic run goes in *rounds*. In each, every worker process (one per slot of a
discovered host, named ``host[slot]`` as Horovod names them) has an :class:`Assignment`:
its rank, the size and placement of the round, and the round's own job id (so the
engine's generations of one round never meet another's). A worker leaves a round when
``hora.torch.elastic.run`` resets (a collective failed: a peer was lost; or the hosts
changed: :class:`~hora.errors.HostsUpdatedInterrupt`): between the engine's shutdown and
its next ``init`` it calls :func:`rejoin`, which tells the driver it is ready and waits
for its place in the next round (or exits the process, code 0, when there is none).

During a round the driver posts host changes (:class:`HostsUpdate`);
:class:`HostUpdates` delivers them to the elastic states of this process
(``State.on_hosts_updated``), so the next ``state.commit()`` raises
``HostsUpdatedInterrupt`` on every rank at the same step, as in Horovod.

Environment of a worker (set by :mod:`hora.runners.elastic.driver`): ``HORA_ELASTIC=1``,
``HORA_ELASTIC_WORKER`` (its name), ``HORA_ELASTIC_ROUND``, ``HORA_ELASTIC_TIMEOUT``, and
the usual ``HORA_*`` contract of its current assignment.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import threading
import time
import weakref
from typing import Any

from hora import settings
from hora.errors import ConfigError, RendezvousError
from hora.native import keys
from hora.native.rendezvous import (
    ENV_CROSS_RANK,
    ENV_CROSS_SIZE,
    ENV_JOB_ID,
    ENV_LOCAL_RANK,
    ENV_LOCAL_SIZE,
    ENV_RANK,
    ENV_RENDEZVOUS_ADDR,
    ENV_SECRET,
    ENV_SIZE,
    Placement,
)

log = logging.getLogger(__name__)

ENV_ELASTIC = "HORA_ELASTIC"
ENV_WORKER = "HORA_ELASTIC_WORKER"
ENV_ROUND = "HORA_ELASTIC_ROUND"
ENV_TIMEOUT = "HORA_ELASTIC_TIMEOUT"
EXIT = b"exit"  # an assignment key's value for a worker that has no place in the round
POLL_INTERVAL = 0.5


@dataclasses.dataclass(frozen=True)
class Assignment:
    """One worker's place in one round (what becomes its ``HORA_*`` contract).

    Attributes:
        round: the round (1, 2, ...).
        size: the ranks of the round.
        place: the worker's rank, local and cross rank and size in it.
        job_id: the round's job id (the engine's generations of one round are its own).
    """

    round: int
    size: int
    place: Placement
    job_id: str

    @property
    def rank(self) -> int:
        return self.place.rank

    def environ(self) -> dict[str, str]:
        """The variables that change from round to round."""
        p = self.place
        return {
            ENV_RANK: str(p.rank), ENV_SIZE: str(self.size),
            ENV_LOCAL_RANK: str(p.local_rank), ENV_LOCAL_SIZE: str(p.local_size),
            ENV_CROSS_RANK: str(p.cross_rank), ENV_CROSS_SIZE: str(p.cross_size),
            ENV_JOB_ID: self.job_id, ENV_ROUND: str(self.round),
        }


@dataclasses.dataclass(frozen=True)
class HostsUpdate:
    """The driver saw the hosts change during ``round``; ``res``: 1 added, 2 removed, 3 both
    (the convention of :meth:`hora.native.elastic.State.on_hosts_updated`)."""

    round: int
    timestamp: float
    res: int


def is_elastic() -> bool:
    """Whether this process is a worker of an elastic ``hora run``."""
    return os.environ.get(ENV_ELASTIC) == "1"


def _client() -> Any:
    from hora.native.rendezvous import KVClient  # (hora.native.rendezvous does not import torch)

    addr, secret = os.environ.get(ENV_RENDEZVOUS_ADDR), os.environ.get(ENV_SECRET)
    if not addr or not secret:
        raise ConfigError("an elastic worker needs HORA_RENDEZVOUS_ADDR and HORA_SECRET (start it with hora run)")
    return KVClient(addr, bytes.fromhex(secret))


def elastic_timeout() -> float:
    """``HORA_ELASTIC_TIMEOUT`` (seconds a worker waits for its next round; default 600).

    Raises:
        ConfigError: not a positive number (named with its value and bounds).
    """
    return float(settings.get(ENV_TIMEOUT))


def rejoin() -> Assignment:
    """Leave the current round and wait for this worker's place in the next one; set its
    ``HORA_*`` variables (call between the engine's shutdown and its next ``init``).

    Exits the process with code 0 when the next round has no place for this worker (its
    slot was removed).

    Raises:
        ConfigError: this process is not an elastic worker.
        RendezvousError: no assignment came within ``HORA_ELASTIC_TIMEOUT`` (the driver is
            gone, or never reached the minimum number of slots).
    """
    if not is_elastic():
        raise ConfigError("rejoin() is for workers of an elastic hora run (HORA_ELASTIC=1)")
    worker, round_ = os.environ[ENV_WORKER], int(os.environ[ENV_ROUND])
    timeout = elastic_timeout()
    client = _client()
    try:
        client.set(keys.elastic_ready_key(round_, worker), b"1")
        log.info("worker %s: left round %d; waiting for the next one", worker, round_)
        try:
            (raw,) = client.wait([keys.elastic_assign_key(round_ + 1, worker)], timeout)
        except RendezvousError as exc:
            raise RendezvousError(f"worker {worker}: no place in round {round_ + 1} of the elastic run within "
                                  f"{timeout:g}s ({ENV_TIMEOUT}): {exc}") from None
    finally:
        client.close()
    if raw == EXIT:
        log.warning("worker %s: the hosts of round %d have no slot for it; exiting", worker, round_ + 1)
        logging.shutdown()
        os._exit(0)  # not SystemExit: the training loop must not catch it and go on
    assignment = pickle.loads(raw)
    os.environ.update(assignment.environ())
    log.info("worker %s: rank %d of %d in round %d", worker, assignment.rank, assignment.size, assignment.round)
    return assignment


class HostUpdates:
    """Delivers the driver's :class:`HostsUpdate` of the current round to registered states
    (a daemon thread polls the driver every 0.5 s while any state is registered)."""

    def __init__(self) -> None:
        self._states: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._seen: float = 0.0

    def register(self, state: Any) -> None:
        """Call ``state.on_hosts_updated(timestamp, res)`` for every host change from now on."""
        if not is_elastic():
            return
        with self._lock:
            self._states.add(state)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="hora-elastic-hosts", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        client = _client()
        while True:
            time.sleep(POLL_INTERVAL)
            try:
                found = client.keys(keys.ELASTIC_HOSTS)
                if not found:
                    continue
                (raw,) = client.wait([keys.ELASTIC_HOSTS], 1.0)
                update: HostsUpdate = pickle.loads(raw)
            except Exception as exc:  # the driver is briefly unreachable: try again
                log.debug("elastic host updates: %s", exc)
                continue
            current = int(os.environ.get(ENV_ROUND, "0"))
            if update.round != current or update.timestamp <= self._seen:
                continue
            self._seen = update.timestamp
            with self._lock:
                states = list(self._states)
            log.info("the hosts changed in round %d (%s); the next commit resets", update.round,
                     {1: "added", 2: "removed", 3: "added and removed"}.get(update.res, update.res))
            for state in states:
                state.on_hosts_updated(update.timestamp, update.res)


#: the process-wide listener (``hora.torch.elastic.run`` registers its states here)
host_updates = HostUpdates()

__all__ = ["Assignment", "HostsUpdate", "HostUpdates", "host_updates", "rejoin", "is_elastic", "elastic_timeout",
           "ENV_ELASTIC", "ENV_WORKER", "ENV_ROUND", "ENV_TIMEOUT", "EXIT"]
