"""``hora run``'s launcher: a command as N ranks on hosts, or through mpiexec.

:class:`CommandRun` starts the ranks of a :class:`CommandConfig` (one validated
dataclass built by the CLI from its flags), watches them with the one monitor
(:func:`hora.runners.driver.monitor.watch`) and stops them; the CLI only parses and prints.
Each rank gets the environment of a job: the launcher's own on this machine, the
forwarded variables on other hosts (:func:`hora.runners.launchers.hosts.forward_environment`),
the engine settings of the flags, ``-x`` variables, and the ``HORA_*`` contract with
the launcher's rendezvous service (``HORA_DRIVER_ADDR`` for ``hora.runners.report``). A rank on
this machine without ``OMP_NUM_THREADS`` gets its share of the cores (:func:`hora.threads.rank_threads`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Mapping
from typing import IO

from hora.errors import ConfigError
from hora import settings
from hora.native.rendezvous import ENV_BACKEND, WorkerEnv, make_secret, tls
from hora.runners.driver.service import DriverService
from hora.runners.launchers.hosts import HostPlan, HostsJob, RankOutput, RankProcess, forward_environment
from hora.runners.slots import HostSlots, RankSlot
from hora.runners.launchers.hosts import hosts_config
from hora.runners.driver.attempts import Launch, run_attempts
from hora.runners.driver.monitor import Policy
from hora.runners.launchers.mpi import MpiJob
from hora.runners.driver.recovery import Attempts, check_max_failures
from hora.runners.spec import ENV_ATTEMPT, ENV_DRIVER_ADDR, ENV_RUN_ID, ENV_SUPERVISOR_PID, new_run_id
from hora.runners.rank.ssh import SshOptions
from hora.threads import rank_threads

log = logging.getLogger(__name__)

COLLECTIVES = settings.BACKENDS


@dataclasses.dataclass(frozen=True)
class CommandConfig:
    """One ``hora run``.

    Attributes:
        command: the program and its arguments.
        num_proc: ranks (``-np``).
        hosts: where they run (``-H`` / ``--hostfile``; default this machine).
        ssh: how remote hosts are reached (``-p``, ``-i``, ``HORA_SSH_ARGS``).
        start_timeout: seconds for hosts to answer and ranks to meet at the engine's start.
        settings: engine variables from the flags (``HORA_CYCLE_TIME``, ...).
        forward: ``-x NAME``: variables passed to remote hosts too.
        values: ``-x NAME=VALUE``: variables set on every rank.
        output_dir: ``--output-filename``.
        network_interface, network_address: what the launcher's services bind.
        collective: the collective backend (``HORA_BACKEND``).
        mpi: start the ranks with mpiexec.
        remote_python: the interpreter of hora's supervisor on remote hosts.
        verbose: print the hosts and commands.
        max_failures: relaunch every rank up to this many times after a retriable
            failure (``--max-failures``; see :mod:`hora.runners.driver.recovery`).
        warm: fork the ranks on this machine whose command is this interpreter from a warm
            server (``--warm``; None: ``HORA_WARM_COMMANDS``); see :func:`warm_command_env`.
        tls: the driver service in TLS with a per-attempt certificate the ranks pin (``--tls``;
            None: ``HORA_TLS``); see :mod:`hora.native.rendezvous.tls`.
    """

    command: tuple[str, ...]
    num_proc: int
    hosts: tuple[HostSlots, ...]
    ssh: SshOptions
    start_timeout: float
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict)
    forward: tuple[str, ...] = ()
    values: Mapping[str, str] = dataclasses.field(default_factory=dict)
    output_dir: str | None = None
    network_interface: str | None = None
    network_address: str | None = None
    collective: str = "auto"
    mpi: bool = False
    remote_python: str | None = None
    verbose: bool = False
    max_failures: int = 0
    warm: bool | None = None
    tls: bool | None = None

    def __post_init__(self) -> None:
        check_max_failures(self.max_failures, "--max-failures")
        if not self.command:
            raise ConfigError("no command given (e.g. hora run -np 2 python train.py)")
        if isinstance(self.num_proc, bool) or not isinstance(self.num_proc, int) or self.num_proc < 1:
            raise ConfigError(f"-np must be >= 1, got {self.num_proc!r}")
        if not self.start_timeout > 0:
            raise ConfigError(f"--start-timeout must be > 0, got {self.start_timeout!r}")
        if self.collective not in COLLECTIVES:
            raise ConfigError(f"collective backend {self.collective!r} is unknown; use one of {', '.join(COLLECTIVES)}")
        if self.mpi and self.max_failures:
            raise ConfigError("--max-failures needs hora's own launcher: under --mpi, mpiexec does not say which "
                              "rank died or how, so a lost rank cannot be told from a failed program")
        if self.mpi and self.collective not in ("auto", "mpi"):
            raise ConfigError(f"--mpi runs the MPI backend; it conflicts with --backend {self.collective}")
        if not self.hosts:
            raise ConfigError("no hosts")
        if any(h.is_local for h in self.hosts) and shutil.which(self.command[0]) is None:
            raise ConfigError(f"command not found: {self.command[0]!r} (not an executable file or on PATH)")
        for name in (*self.forward, *self.values):
            if not name or "=" in name or not name.replace("_", "a").isalnum():
                raise ConfigError(f"-x {name!r} is not a valid environment variable name")


def command_environment(cfg: CommandConfig, plan: HostPlan, service_addr: str, run_id: str,
                        remote: bool) -> dict[str, str]:
    """The environment of a rank of ``cfg`` before its place in the job is added: the
    launcher's own on this machine (the forwarded variables on a remote host), the engine
    settings, ``-x`` values, the network interface, and the driver service's address."""
    if remote:
        env = forward_environment(os.environ, cfg.forward)
    else:
        env = dict(os.environ)
        env.pop(ENV_SUPERVISOR_PID, None)
    env.update(cfg.settings)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if plan.interface:
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = plan.interface
    elif plan.all_loopback:
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.update(cfg.values)
    env[ENV_DRIVER_ADDR] = service_addr
    env[ENV_RUN_ID] = run_id
    return env


def warm_command_env(cfg: CommandConfig, env: Mapping[str, str]) -> dict[str, str] | None:
    """The variables that key the warm server of ``cfg``'s ranks on this machine (those of
    ``env``, a rank's environment, outside ``HORA_*``), or None when they start as fresh
    processes: ``--warm``/``HORA_WARM_COMMANDS`` is off, warm ranks are off
    (``HORA_WARM_WORKERS=0``, not Linux), or the command is not this interpreter running a
    script or a module (:func:`hora.runners.rank.warm.client.forkable_command`)."""
    from hora.runners.rank.warm import client as warm

    merged = {**os.environ, **env}
    wanted = cfg.warm if cfg.warm is not None else settings.get(warm.ENV_COMMANDS, merged)
    if not wanted or cfg.mpi or not warm.enabled(merged) or \
            not warm.forkable_command(cfg.command, path=merged.get("PATH")):
        return None
    return {k: v for k, v in env.items() if not k.startswith("HORA_")}


class CommandRun:
    """Start, watch and stop the ranks of one :class:`CommandConfig`.

    Use as ``run.start(); run.wait()`` inside ``try/finally: run.stop()``.
    """

    def __init__(self, cfg: CommandConfig, stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> None:
        self.cfg = cfg
        self.run_id = new_run_id()
        self.plan = HostPlan.make(cfg.hosts, cfg.num_proc, cfg.ssh, interface=cfg.network_interface,
                                  address=cfg.network_address)
        self._streams = (stdout, stderr)
        self.attempts = Attempts(self.run_id, cfg.max_failures, "mpiexec" if cfg.mpi else "hosts")
        self.job: HostsJob | MpiJob | None = None
        self.started = False  # every rank of the current attempt was started
        self._open_attempt()

    def _open_attempt(self) -> None:
        """A fresh secret, service and output sink for the current attempt."""
        self.secret = make_secret()
        self.service = DriverService(self.secret, self.cfg.num_proc, self.run_id, bind=self.plan.bind,
                                     advertise=self.plan.service_address, verbose=1, stdout=self._streams[0],
                                     stderr=self._streams[1], attempt=self.attempts.number,
                                     label=self.attempts.label(), tls=self.cfg.tls)
        self.output = RankOutput(self.service.emit, self.cfg.output_dir, self.cfg.num_proc)
        self.job = None
        self.started = False
        self._closed = False  # the attempt's ranks were stopped and its service closed

    def describe(self) -> list[str]:
        """What ``--verbose`` prints before starting."""
        lines = [f"hora run {self.run_id}: {self.cfg.num_proc} rank(s), services on {self.service.addr}"]
        for s in self.plan.slots:
            how = "ssh" if s.host.name in self.plan.addresses else "local"
            lines.append(f"  rank {s.rank}: {s.host.name} ({how}) local_rank {s.local_rank}/{s.local_size} "
                         f"cross_rank {s.cross_rank}/{s.cross_size}")
        return lines

    def _env(self, remote: bool) -> dict[str, str]:
        env = command_environment(self.cfg, self.plan, self.service.addr, self.run_id, remote)
        env[ENV_ATTEMPT] = str(self.attempts.number)
        return env

    def _make_rank(self, slot: RankSlot, advertise: str, remote: bool) -> RankProcess:
        env = self._env(remote)
        env.update(WorkerEnv(
            placement=dataclasses.replace(slot.placement, size=self.cfg.num_proc, host=advertise),
            rendezvous_addr=self.service.addr, secret=self.secret, job_id=self.run_id, backend=self.cfg.collective,
            start_timeout=self.cfg.start_timeout,
        ).to_environ())
        env.update(tls.environ(self.secret))  # the certificate to pin when the run uses TLS
        if not remote:  # its share of this host's cores, as torchrun does (a remote host's are its own)
            threads = rank_threads(slot.placement.local_size, env)
            if threads is not None:
                env["OMP_NUM_THREADS"] = str(threads)
        warm = None if remote else warm_command_env(self.cfg, env)
        return RankProcess(slot.rank, self.cfg.command, env, warm=warm, warm_command=warm is not None)

    def start(self) -> None:
        """Reach the hosts and start every rank.

        Raises:
            WorkerFailedError: a host cannot be reached or cannot run hora (named).
            ConfigError: no mpiexec (``--mpi``), an interface a host lacks.
        """
        cfg = self.cfg
        if cfg.mpi:
            env = self._env(remote=False)
            env[ENV_BACKEND] = "mpi"
            self.job = MpiJob(cfg.command, cfg.hosts, cfg.ssh, env, self.output, self.service, cfg.num_proc,
                              functions=False, interface=cfg.network_interface)
            log.info("mpiexec: %s", self.job.describe())
            self.job.start()
            self.started = True
            return
        config = hosts_config(cfg.ssh, cfg.remote_python, cfg.start_timeout)
        self.job = HostsJob(self.plan, self._make_rank, self.service, output=self.output, config=config,
                            functions=False)
        self.job.start()
        self.started = True

    def wait(self) -> None:
        """Return once every rank exited 0. With ``max_failures``, a retriable failure (a
        rank killed by a signal, a lost host: :mod:`hora.runners.driver.faults`) stops every rank
        and starts them all again, up to ``max_failures`` times (the one attempt loop,
        :func:`hora.runners.driver.attempts.run_attempts`).

        Raises:
            WorkerFailedError: the first failure (rank, host, exit code, traceback); after
                relaunches, naming every attempt's cause.
            RendezvousError: ranks never reached the engine's start barrier.
        """
        assert self.job is not None, "start() first"
        run_attempts(self._relaunch, self.attempts, self.cfg.num_proc, first=self._launch(), close_last=False)

    def _launch(self) -> Launch:
        """The current attempt as the attempt loop watches it."""
        assert self.job is not None
        policy = Policy(num_proc=self.cfg.num_proc, run_id=self.run_id, start_timeout=self.cfg.start_timeout,
                        functions=False, poll_interval=0.05)
        return Launch(self.service, self.job, policy, self.stop)

    def _relaunch(self, _num_proc: int, _time_left: float | None) -> Launch:
        """The next attempt (the loop stopped the failed one): a fresh service, every rank started again."""
        self._open_attempt()
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self._launch()

    def stop(self) -> None:
        """Stop every rank on every host and close the services (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.job is not None:
                self.job.cancel()
            else:
                self.output.close()
        finally:
            self.service.close()


__all__ = ["CommandConfig", "CommandRun", "command_environment", "warm_command_env"]
