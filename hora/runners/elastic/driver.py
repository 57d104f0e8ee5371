"""Elastic ``hora run``: ``--min-np M --max-np N --host-discovery-script S`` (horovodrun's semantics).

The job runs in *rounds* (:mod:`hora.runners.elastic.membership` is the workers' side). A round
gives every slot of the usable hosts, up to ``--max-np``, a worker process (``host[slot]``)
and a rank; ranks fill the hosts in order, the oldest hosts first, so rank 0 is always a
worker that survived the previous round and the state is broadcast from it. A round
ends when every worker of it has left it:

* it *reset* (``hora.torch.elastic.run`` caught a failed collective, or the hosts changed
  and ``state.commit()`` raised ``HostsUpdatedInterrupt``) and waits for its next place;
* it *failed* (exited non-zero, killed): its host is blacklisted (``--blacklist-cooldown-range``);
* it *succeeded* (exited 0).

Then: every worker succeeded: the job is done. Any worker succeeded while others did not,
or every worker failed, or every host of the round is blacklisted, or ``--reset-limit``
rounds have been reset already: the job fails, naming the root cause. Otherwise the next
round starts once the hosts offer at least ``--min-np`` slots (within
``--elastic-timeout``): survivors get their new rank (or exit, if their slot is gone),
new slots get new workers, which take the state from rank 0.

The discovery script runs every second. When its hosts would change the round's workers,
the driver tells the workers (``HostsUpdate``), whose next commit resets them.

A round is an attempt of the one attempt loop (:func:`~hora.runners.driver.attempts.run_attempts`):
:meth:`ElasticRun.start` starts round 1 (the factory of the next ones is ``_start_round``), a
round's watch runs the discovery and polls its workers until every one left it, the loop's
policy (:class:`~hora.runners.elastic.rounds.ElasticRounds`) decides as above, closing a round
only tears down its failed workers (survivors keep their processes; one driver service for
the whole run, ``stop()`` stops everything), and the loop's ``next_size`` waits for the
next round's slots.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import time
from typing import IO, Any

from hora.errors import ConfigError, RendezvousError
from hora.native import keys
from hora.native.rendezvous import Placement, WorkerEnv, make_secret, tls
from hora.runners import network
from hora.runners.command import CommandConfig, command_environment
from hora.runners.driver.attempts import Launch, run_attempts
from hora.runners.driver.faults import Failure
from hora.runners.elastic.discovery import DiscoveryError, HostDiscoveryScript, HostManager, assign, check_cooldown_range
from hora.runners.driver.service import DriverService
from hora.runners.launchers.hosts import HostPlan, HostsJob, RankOutput, RankProcess
from hora.runners.slots import HostSlots, RankSlot
from hora.runners.launchers.hosts import hosts_config
from hora.runners.elastic.membership import ENV_ELASTIC, ENV_TIMEOUT, ENV_WORKER, EXIT, Assignment, HostsUpdate
from hora.runners.elastic.rounds import FAILURE, READY, RESET_LIMIT_MESSAGE, SUCCESS, ElasticRounds, Left, RoundEnded
from hora.runners.spec import new_run_id

log = logging.getLogger(__name__)

DISCOVERY_INTERVAL = 1.0  # seconds between runs of the discovery script
POLL_INTERVAL = 0.1


@dataclasses.dataclass(frozen=True)
class ElasticConfig:
    """One elastic ``hora run``.

    Attributes:
        command: everything of a plain run (its ``num_proc``: the ranks to start with,
            ``-np``; its ``hosts``: what the discovery script printed at start).
        discovery: the script (``--host-discovery-script``).
        min_np, max_np: the bounds of the job's size (``max_np`` None: every slot).
        slots_per_host: slots of a host the script prints without ``:slots``.
        elastic_timeout: seconds to wait for ``min_np`` slots after a round ended, and
            for every worker to leave a round once one has.
        reset_limit: the most rounds after the first (None: no limit).
        cooldown_range: ``(min, max)`` seconds a failing host stays blacklisted (None: for good).
    """

    command: CommandConfig
    discovery: str
    min_np: int
    max_np: int | None = None
    slots_per_host: int | None = None
    elastic_timeout: float = 600.0
    reset_limit: int | None = None
    cooldown_range: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        for name, value in (("--min-np", self.min_np), ("--max-np", self.max_np)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if self.max_np is not None and self.min_np > self.max_np:
            raise ConfigError(f"--min-np {self.min_np} is greater than --max-np {self.max_np}")
        np_ = self.command.num_proc
        if np_ < self.min_np or (self.max_np is not None and np_ > self.max_np):
            raise ConfigError(f"-np {np_} must lie within --min-np {self.min_np} and --max-np "
                              f"{self.max_np if self.max_np is not None else 'unbounded'}")
        if not self.elastic_timeout > 0:
            raise ConfigError(f"--elastic-timeout must be > 0 seconds, got {self.elastic_timeout!r}")
        if self.reset_limit is not None and (isinstance(self.reset_limit, bool) or not isinstance(self.reset_limit, int)
                                             or self.reset_limit < 0):
            raise ConfigError(f"--reset-limit must be an integer >= 0, got {self.reset_limit!r}")
        check_cooldown_range(self.cooldown_range)
        if self.command.mpi:
            raise ConfigError("elastic runs (--host-discovery-script) use hora's own launcher, not --mpi")
        if self.command.max_failures:
            raise ConfigError("--max-failures relaunches a run of fixed size; an elastic run recovers by itself "
                              "(bound it with --reset-limit)")


def discover_at_start(discovery: str, slots_per_host: int | None, np_: int) -> list[HostSlots]:
    """The hosts the discovery script prints at start (what the run starts on).

    Raises:
        ConfigError: the script fails or prints garbage (script and line named), or its
            hosts offer fewer than ``np_`` slots.
    """
    found = HostDiscoveryScript(discovery, slots_per_host).find_available_hosts_and_slots()
    total = sum(found.values())
    if total < np_:
        listed = ", ".join(f"{h}:{s}" for h, s in found.items()) or "no hosts"
        raise ConfigError(f"host discovery script {discovery!r} offers {total} slot(s) ({listed}) at start; the run "
                          f"needs {np_} (-np / --min-np)")
    return [HostSlots(h, s) for h, s in found.items()]


@dataclasses.dataclass
class _Worker:
    name: str
    slot: RankSlot  # its host and local slot (rank fields: of the round it started in)
    assignment: Assignment
    job: HostsJob | None = None
    state: str | None = None  # how it left the current round (None: still in it)


class ElasticRun:
    """Start, watch and stop the rounds of one :class:`ElasticConfig` (``start()``, ``wait()``,
    ``stop()`` in ``finally``, as :class:`~hora.runners.command.CommandRun`)."""

    def __init__(self, cfg: ElasticConfig, stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> None:
        self.cfg = cfg
        c = cfg.command
        self.run_id = new_run_id()
        self.discovery = HostDiscoveryScript(cfg.discovery, cfg.slots_per_host)
        self.hosts = HostManager(self.discovery.find_available_hosts_and_slots, cfg.cooldown_range)
        self.hosts.update()
        self.plan = HostPlan.make(list(c.hosts), sum(h.slots for h in c.hosts), c.ssh, interface=c.network_interface,
                                  address=c.network_address)
        self.secret = make_secret()
        self.service = DriverService(self.secret, max(1, cfg.max_np or c.num_proc), self.run_id, bind=self.plan.bind,
                                     advertise=self.plan.service_address, verbose=1, stdout=stdout, stderr=stderr,
                                     tls=c.tls)
        self.config = hosts_config(c.ssh, c.remote_python, c.start_timeout)
        self.rounds = ElasticRounds(self.run_id, self.hosts, cfg.reset_limit)
        self.round = 0
        self.workers: dict[str, _Worker] = {}
        self.leaving: list[_Worker] = []  # survivors without a place: they exit on their own
        self.ended: list[_Worker] = []  # failed workers (torn down when their round closed) and unstarted ones
        self._round_failures: list[tuple[_Worker, Failure]] = []  # the current round's, in the order seen
        self.started = False
        self._next: tuple[list[RankSlot], dict[str, _Worker]] | None = None  # the next round's slots and survivors
        self._last_discovery = time.monotonic()
        self._round_ending_since: float | None = None
        self._notified: tuple[int, tuple[str, ...]] | None = None

    @property
    def resets(self) -> int:
        """Rounds reset so far (what ``--reset-limit`` bounds)."""
        return self.rounds.resets

    def describe(self) -> list[str]:
        """What ``--verbose`` prints before starting."""
        hosts = ", ".join(f"{h}:{n}" for h, n in self.hosts.hosts().items())
        return [f"hora run {self.run_id} (elastic): -np {self.cfg.command.num_proc}, --min-np {self.cfg.min_np}, "
                f"--max-np {self.cfg.max_np or 'unbounded'}; hosts now {hosts}; services on {self.service.addr}"]

    # -- rounds: the attempts of the one attempt loop ------------------------------------------
    def start(self) -> None:
        """Start round 1 on the hosts found at start (``-np`` ranks at least, up to ``--max-np``).

        Raises:
            ConfigError: fewer slots than ``-np``.
            WorkerFailedError: a host cannot be reached.
        """
        slots = assign(self.hosts.hosts(), self.cfg.command.num_proc, self.cfg.max_np)
        self._begin_round(slots, {})
        self.started = True

    def wait(self) -> None:
        """Return once every worker of a round exited 0 (the rounds are the attempts of
        :func:`~hora.runners.driver.attempts.run_attempts`; :class:`~hora.runners.elastic.rounds.ElasticRounds`
        decides after each).

        Raises:
            WorkerFailedError: the job failed (the root cause named: rank, host, how).
            RendezvousError: workers never left a round, or too few slots came back, in time.
        """
        assert self.started, "start() first"
        run_attempts(self._start_round, self.rounds, len(self.workers), first=self._launch(),
                     next_size=self._next_round, close_last=False)

    def _launch(self) -> Launch:
        """The current round as the attempt loop watches it."""
        return Launch(self.service, None, None, self._close_round, watch=self._watch_round)

    def _start_round(self, num_proc: int, _time_left: float | None) -> Launch:
        """The job factory of the rounds after the first: the round :meth:`_next_round` planned."""
        assert self._next is not None and len(self._next[0]) == num_proc
        slots, survivors = self._next
        self._next = None
        self._begin_round(slots, survivors)
        return self._launch()

    def _begin_round(self, slots: list[RankSlot], survivors: dict[str, _Worker]) -> None:
        self.round += 1
        job_id = f"{self.run_id}.r{self.round}"
        workers: dict[str, _Worker] = {}
        new: list[_Worker] = []
        try:
            for s in slots:
                name = f"{s.host.name}[{s.local_rank}]"
                a = Assignment(self.round, len(slots), Placement(
                    rank=s.rank, size=len(slots), local_rank=s.local_rank, local_size=s.local_size,
                    cross_rank=s.cross_rank, cross_size=s.cross_size, host=s.host.name), job_id)
                w = survivors.pop(name, None)
                if w is not None:
                    w.assignment, w.state = a, None
                    self.service.server.set(keys.elastic_assign_key(self.round, name), pickle.dumps(a))
                else:
                    w = _Worker(name, s, a)
                    new.append(w)
                    self._start_worker(w)
                workers[name] = w
        except BaseException:
            self.ended.extend(new)  # what did start is stopped by stop()
            raise
        for w in survivors.values():
            self.service.server.set(keys.elastic_assign_key(self.round, w.name), EXIT)
            self.leaving.append(w)
        self.workers = workers
        self._round_failures = []
        self._round_ending_since = None
        log.warning("elastic run %s: round %d: %d rank(s): %s", self.run_id, self.round, len(slots),
                    ", ".join(f"{n}=rank {w.assignment.rank}" for n, w in workers.items()))

    def _start_worker(self, w: _Worker) -> None:
        c = self.cfg.command
        host = w.slot.host.name
        remote = not HostSlots(host, 1).is_local
        addresses = {host: self.plan.addresses.get(host) or network.resolve(c.ssh.destination_hostname(host))} \
            if remote else {}
        one = RankSlot(Placement(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1, host=host),
                       HostSlots(host, 1))
        plan = HostPlan((one,), addresses, self.plan.bind, self.plan.service_address, self.plan.local_address,
                        self.plan.interface)
        folder = os.path.join(c.output_dir, w.name) if c.output_dir else None
        output = RankOutput(lambda _r, stream, line, w=w: self.service.emit(w.assignment.rank, stream, line),
                            folder, 1)

        def make_rank(_slot: RankSlot, advertise: str, is_remote: bool) -> RankProcess:
            a, p = w.assignment, w.assignment.place
            env = command_environment(c, self.plan, self.service.addr, self.run_id, is_remote)
            env.update(WorkerEnv(
                placement=dataclasses.replace(p, size=a.size, host=advertise), rendezvous_addr=self.service.addr,
                secret=self.secret, job_id=a.job_id, backend=c.collective,
                start_timeout=c.start_timeout).to_environ())
            env.update(tls.environ(self.secret))  # the certificate to pin when the run uses TLS
            env.update(a.environ())
            env.update({ENV_ELASTIC: "1", ENV_WORKER: w.name, ENV_TIMEOUT: f"{self.cfg.elastic_timeout:g}"})
            return RankProcess(0, c.command, env)

        w.job = HostsJob(plan, make_rank, self.service, output=output, config=self.config, functions=False)
        log.info("elastic run %s: starting worker %s (rank %d)", self.run_id, w.name, w.assignment.rank)
        w.job.start()

    # -- watching a round -------------------------------------------------------------------------
    def _watch_round(self) -> list[Any]:
        """Run the discovery and poll the round's workers until every one left the round.

        Returns:
            ``[]`` once every worker of the round exited 0.

        Raises:
            RoundEnded: every worker left, not all by succeeding (:class:`~hora.runners.elastic.rounds.ElasticRounds`
                decides).
            RendezvousError: workers neither reset nor ended within ``--elastic-timeout`` of the others.
        """
        while True:
            self._discover()
            if self._poll_round():
                break
            time.sleep(POLL_INTERVAL)
        states = {w.state for w in self.workers.values()}
        if states == {SUCCESS}:
            log.info("elastic run %s: every rank of round %d finished", self.run_id, self.round)
            return []
        left = tuple(Left(w.name, w.assignment.rank, w.slot.host.name, w.state) for w in self.workers.values()
                     if w.state is not None)  # every one, once the round ended
        raise RoundEnded(self.round, left, tuple(f for _, f in self._round_failures))

    def _discover(self) -> None:
        now = time.monotonic()
        if now - self._last_discovery < DISCOVERY_INTERVAL:
            return
        self._last_discovery = now
        try:
            res = self.hosts.update()
        except DiscoveryError as exc:  # transient after the first run (Horovod): keep the hosts as they were
            log.warning("elastic run %s: %s; keeping the hosts as they were", self.run_id, exc)
            return
        if not res:
            return
        names = self._next_names()
        if names == tuple(self.workers) or self._notified == (self.round, names):
            return
        self._notified = (self.round, names)
        log.warning("elastic run %s: the hosts changed (%s); telling the workers of round %d", self.run_id,
                    ", ".join(f"{h}:{s}" for h, s in self.hosts.hosts().items()) or "no hosts", self.round)
        self.service.server.set(keys.ELASTIC_HOSTS, pickle.dumps(HostsUpdate(self.round, time.time(), res)))

    def _next_names(self) -> tuple[str, ...]:
        try:
            slots = assign(self.hosts.hosts(), self.cfg.min_np, self.cfg.max_np, self._host_order())
        except ConfigError:
            return ()
        return tuple(f"{s.host.name}[{s.local_rank}]" for s in slots)

    def _host_order(self) -> list[str]:
        return list(dict.fromkeys(w.slot.host.name for w in sorted(self.workers.values(),
                                                                   key=lambda w: w.assignment.rank)))

    def _poll_round(self) -> bool:
        """Whether every worker of the round has left it (each one's state set)."""
        ready = {k.rsplit("/", 1)[1] for k in self.service.server.keys(keys.elastic_ready_prefix(self.round))}
        for w in self.workers.values():
            if w.state is not None or w.job is None:
                continue
            code = w.job.exit_codes().get(0)
            lost = w.job.failures()
            if w.name in ready and code is None:
                w.state = READY
            elif code == 0:
                w.state = SUCCESS
            elif code is not None or lost:
                w.state = FAILURE
                failure = min(lost, key=lambda f: f.seq) if lost else Failure(0, 0, w.slot.host.name, "failed")
                failure = dataclasses.replace(failure, rank=w.assignment.rank, host=w.slot.host.name)
                self._round_failures.append((w, failure))
                log.warning("elastic run %s: worker %s (%s) of round %d", self.run_id, w.name, failure.describe(),
                            self.round)
        states = [w.state for w in self.workers.values()]
        if all(s is None for s in states):
            return False
        now = time.monotonic()
        if self._round_ending_since is None:
            self._round_ending_since = now
        if any(s is None for s in states):
            if now - self._round_ending_since > self.cfg.elastic_timeout:
                stuck = [n for n, w in self.workers.items() if w.state is None]
                raise RendezvousError(f"worker(s) {stuck} of round {self.round} neither reset nor ended within "
                                      f"--elastic-timeout {self.cfg.elastic_timeout:g}s of the others")
            return False
        return True

    def _close_round(self) -> None:
        """Close a round that did not end the run: tear down its failed workers (their
        processes exited or were lost; their process groups, output and temporary folder go);
        the others run on into the next round."""
        failed = [w for w, _ in self._round_failures]
        self.ended.extend(failed)
        for w in failed:
            if w.job is not None:
                try:
                    w.job.cancel()
                except Exception:  # noqa: BLE001 - a teardown error must not end the run; stop() tries again
                    log.warning("elastic run %s: tearing down failed worker %s", self.run_id, w.name, exc_info=True)

    def _next_round(self, _num_proc: int) -> int:
        """The size of the next round (the loop's ``next_size``), once the hosts offer ``--min-np``
        slots; plans it for :meth:`_start_round`: the survivors (ready workers on hosts not
        blacklisted), the new slots; tells the ready workers without a place to exit.

        Raises:
            RendezvousError: too few slots within ``--elastic-timeout``.
            WorkerFailedError: no survivor is on the next round's first slot (no state to broadcast).
        """
        ready = [w for w in self.workers.values() if w.state == READY]
        survivors = {w.name: w for w in ready if not self.hosts.is_blacklisted(w.slot.host.name)}
        slots = self._wait_for_slots(self._host_order())
        first = f"{slots[0].host.name}[{slots[0].local_rank}]"
        if first not in survivors:
            raise self.rounds.root_error(f"no worker of round {self.round} survives on the hosts of round "
                                         f"{self.round + 1}, so there is no state to broadcast")
        for w in ready:
            if w.name not in survivors:  # on a blacklisted host: no place
                self.service.server.set(keys.elastic_assign_key(self.round + 1, w.name), EXIT)
                self.leaving.append(w)
        self._next = (slots, survivors)
        return len(slots)

    def _wait_for_slots(self, order: list[str]) -> list[RankSlot]:
        deadline = time.monotonic() + self.cfg.elastic_timeout
        while True:
            try:
                return assign(self.hosts.hosts(), self.cfg.min_np, self.cfg.max_np, order)
            except ConfigError as exc:
                if time.monotonic() > deadline:
                    raise RendezvousError(f"elastic run {self.run_id}: {exc} for --elastic-timeout "
                                          f"{self.cfg.elastic_timeout:g}s after round {self.round}") from None
            time.sleep(DISCOVERY_INTERVAL)
            try:
                self.hosts.update()
            except DiscoveryError as exc:
                log.warning("elastic run %s: %s", self.run_id, exc)

    def stop(self) -> None:
        """Stop every worker and close the services (idempotent)."""
        try:
            for w in [*self.workers.values(), *self.leaving, *self.ended]:
                if w.job is not None:
                    w.job.cancel()
        finally:
            self.service.close()


__all__ = ["ElasticConfig", "ElasticRun", "discover_at_start", "RESET_LIMIT_MESSAGE"]
