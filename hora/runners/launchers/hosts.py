"""The hosts launcher (:class:`HostsLauncher`, ``-H a:2,b:2``) and its ranks on a list of hosts,
as one :class:`~hora.runners.launcher.Job` (:class:`HostsJob`): processes on this
machine, and on every other host a supervisor reached over ssh.

:class:`HostsJob` starts in two steps, so a bad host stops the run before any rank
starts: it opens one ssh session per remote host and waits for each supervisor's hello
(ssh's own error names a host it cannot reach, at once), then builds every rank's
process (:data:`RankFactory`, which learns the address each host advertises) and
starts them. Every rank exit is seen the moment it happens (a waiter thread per local
rank, the supervisor's ``exit`` event for a remote one) and a non-zero exit takes a
number from the driver service's failure counter then, so the monitor can tell which
rank failed first. :meth:`HostsJob.cancel` stops every host at once (``stop`` to each
supervisor, SIGTERM/SIGKILL to each local process group) and ends the ssh sessions.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from hora.errors import WorkerFailedError
from hora.runners import network
from hora.runners.rank import remote
from hora import settings
from hora.errors import ConfigError
from hora.runners.launcher import Job, Launcher, start_or_cancel
from hora.runners.slots import HostSlots, RankSlot, assign_ranks, resolve_hosts
from hora.runners.driver.monitor import Failure
from hora.runners.rank.procs import ProcessLauncher, last_traceback
from hora.native.rendezvous import ENV_SECRET
from hora.runners.spec import (
    ENV_ADVERTISE_ADDR,
    ENV_HEARTBEAT_TIMEOUT,
    ENV_SUPERVISOR_PID,
    ENV_TERMINATE_GRACE,
    LaunchSpec,
    RankContext,
)
from hora.runners.rank.main import TO_DRIVER
from hora.runners.rank.supervise import worker_argv, worker_process_env
from hora.runners.rank.ssh import ENV_SSH_ARGS, HostUnreachable, SshHost, SshOptions

if TYPE_CHECKING:
    from hora.runners.driver.service import DriverService

log = logging.getLogger(__name__)

DRAIN_TIMEOUT = 2.0
FORWARDED = ("PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
NOT_FORWARDED = frozenset({ENV_SECRET, ENV_SUPERVISOR_PID, ENV_SSH_ARGS})


@dataclasses.dataclass(frozen=True)
class RankProcess:
    """What to start for one rank.

    Attributes:
        rank: the rank.
        argv: the command line.
        env: on this machine the whole environment; on a remote host the variables set on
            top of the supervisor's own environment (the forwarded ones).
        stdin: bytes written to the rank's stdin (a pickled spec; may hold the secret).
        result_path: where a local function rank writes its value (else it is posted to
            the driver service).
        warm: fork the rank (``python -m hora.runners.rank.main``) on this machine from a warm
            server (:mod:`hora.runners.rank.warm.client`); the mapping holds the run's variables
            the rank sets before its imports (part of the server's key). None: a fresh process.
        warm_command: with ``warm``, ``argv`` is a ``hora run`` command (``python SCRIPT ...``
            or ``python -m MODULE ...``) forked with a fresh interpreter's semantics.
    """

    rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = dataclasses.field(repr=False)
    stdin: bytes | None = dataclasses.field(default=None, repr=False)
    result_path: str | None = None
    warm: Mapping[str, str] | None = dataclasses.field(default=None, repr=False)
    warm_command: bool = False


#: ``(slot, address its host advertises, the host is remote) -> RankProcess``
RankFactory = Callable[[RankSlot, str, bool], RankProcess]


def forward_environment(environ: Mapping[str, str], names: Sequence[str] = (),
                        values: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a rank on a remote host gets from the launcher: the job's ``HORA_*``
    (not the secret of another job), ``PATH``, ``PYTHONPATH`` and a few more
    (:data:`FORWARDED`), the ``names`` of ``-x NAME`` and the ``values`` of ``-x NAME=VALUE``."""
    out = {k: v for k, v in environ.items()
           if (k.startswith("HORA_") or k in FORWARDED) and k not in NOT_FORWARDED}
    for name in names:
        if name in environ:
            out[name] = environ[name]
    out.update(values or {})
    return out


class RankOutput:
    """Where rank output goes: the driver service's printer, the per-rank files of
    ``--output-filename`` (``<dir>/rank.<r>/stdout|stderr``, ranks zero-padded as Horovod
    does), and a tail of each rank's stderr for failure reports."""

    def __init__(self, emit: Callable[[int, str, str], None], output_dir: str | None, num_proc: int,
                 tail_lines: int = 400) -> None:
        self._emit = emit
        self._dir = output_dir
        self._width = len(str(max(0, num_proc - 1)))
        self._files: dict[tuple[int, str], IO[str]] = {}
        self._tails: dict[int, collections.deque[str]] = collections.defaultdict(
            lambda: collections.deque(maxlen=tail_lines))
        self._lock = threading.Lock()
        self._closed = False
        for rank in range(num_proc if output_dir is not None else 0):  # as Horovod: every rank has both files
            folder = self.rank_dir(rank)
            assert folder is not None
            os.makedirs(folder, exist_ok=True)
            for stream in ("stdout", "stderr"):
                self._files[(rank, stream)] = open(os.path.join(folder, stream), "w")  # noqa: SIM115

    def rank_dir(self, rank: int) -> str | None:
        """The output folder of a rank (None without ``--output-filename``)."""
        return None if self._dir is None else os.path.join(self._dir, f"rank.{rank:0{self._width}d}")

    def __call__(self, rank: int, stream: str, line: str) -> None:
        with self._lock:
            if stream == "stderr":
                self._tails[rank].append(line)
            if self._dir is not None and not self._closed:
                fh = self._files.get((rank, stream))
                if fh is None:
                    folder = self.rank_dir(rank)
                    assert folder is not None
                    os.makedirs(folder, exist_ok=True)
                    fh = self._files[(rank, stream)] = open(os.path.join(folder, stream), "w")  # noqa: SIM115
                fh.write(line + "\n")
                fh.flush()
        self._emit(rank, stream, line)

    def traceback_of(self, rank: int) -> str | None:
        """The last Python traceback a rank wrote to stderr, else its last stderr lines."""
        with self._lock:
            return last_traceback(list(self._tails.get(rank, ())))

    def close(self) -> None:
        """Close the files (lines that still arrive are printed, not written)."""
        with self._lock:
            self._closed = True
            for fh in self._files.values():
                fh.close()
            self._files.clear()


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """Where the ranks of a run go and which addresses everything uses.

    Attributes:
        slots: each rank's host and place (:func:`hora.runners.slots.assign_ranks`).
        addresses: each remote host's address, as resolved here (through ``ssh -G``, so
            ``~/.ssh/config`` aliases work); its ranks advertise it.
        bind: where the launcher's services listen.
        service_address: how every rank reaches them.
        local_address: what the ranks on this machine advertise to their peers.
        interface: ``--network-interface``: every host advertises that interface's address.
    """

    slots: tuple[RankSlot, ...]
    addresses: Mapping[str, str]
    bind: str
    service_address: str
    local_address: str
    interface: str | None = None

    @property
    def all_loopback(self) -> bool:
        """Every rank is on this machine or on a loopback address (Gloo may bind ``lo``)."""
        return network.is_loopback(self.service_address)

    @classmethod
    def make(cls, hosts: Sequence[HostSlots], num_proc: int, ssh: SshOptions, *, interface: str | None = None,
             address: str | None = None) -> HostPlan:
        """Assign ranks and choose addresses.

        Raises:
            ConfigError: more ranks than slots, a host that does not resolve, a bad
                ``interface`` / ``address`` (see :func:`hora.runners.network.choose_service_address`).
        """
        slots = tuple(assign_ranks(hosts, num_proc))
        remote_names = list(dict.fromkeys(s.host.name for s in slots if not s.host.is_local))
        addresses = {h: network.resolve(ssh.destination_hostname(h)) for h in remote_names}
        override = os.environ.get(ENV_ADVERTISE_ADDR)
        if not remote_names and override and not (interface or address):
            bind = "127.0.0.1" if network.is_loopback(override) else "0.0.0.0"
            return cls(slots, addresses, bind, override, override, None)
        chosen = network.choose_service_address(list(addresses.values()), interface=interface, address=address)
        return cls(slots, addresses, chosen, chosen, chosen, interface)


@dataclasses.dataclass(frozen=True)
class HostsConfig:
    """How a :class:`HostsJob` reaches and runs its hosts.

    Attributes:
        ssh: options for the remote hosts.
        remote_python: the interpreter that runs the supervisor on remote hosts.
        start_timeout: seconds for every remote host to answer.
        grace: seconds between SIGTERM and SIGKILL when stopping ranks.
        heartbeat_timeout: seconds of silence after which a host counts as lost.
    """

    ssh: SshOptions
    remote_python: str
    start_timeout: float
    grace: float
    heartbeat_timeout: float


class HostsJob(Job):
    """The ranks of one run on their hosts (see the module docstring).

    Args:
        plan: where each rank runs, and the addresses.
        make_rank: builds each rank's process.
        service: the driver service (failure counter, results of remote ranks).
        output: the sink of every output line.
        config: how hosts are reached.
        functions: ranks are hora workers whose values :meth:`poll` returns; else commands
            whose exit codes it returns.
        name: in the name of the job's private folder (:attr:`tmpdir`; e.g. the run id, which
            a local function rank's command line then shows through its result path).
    """

    def __init__(self, plan: HostPlan, make_rank: RankFactory, service: DriverService, *,
                 output: RankOutput, config: HostsConfig, functions: bool, name: str = "job") -> None:
        self.plan = plan
        self.slots = list(plan.slots)
        self.make_rank = make_rank
        self.service = service
        self.output = output
        self.config = config
        self.functions = functions
        self.num_proc = len(self.slots)
        self._by_host: dict[str, list[RankSlot]] = {}
        for s in self.slots:
            self._by_host.setdefault(s.host.name, []).append(s)
        self._local = ProcessLauncher(output)
        self._ssh: dict[str, SshHost] = {}
        self._procs: dict[int, RankProcess] = {}
        self._exits: dict[int, int] = {}
        self._remote_exit: dict[int, tuple[int, int | None]] = {}
        self._failures: list[Failure] = []
        self._lost: set[str] = set()
        self._lock = threading.Lock()
        self._cancelled = False
        self._tmpdir = tempfile.mkdtemp(prefix=f"hora-{name}-")
        os.chmod(self._tmpdir, 0o700)

    @property
    def tmpdir(self) -> str:
        """A private folder that lives as long as the job (local result files)."""
        return self._tmpdir

    def host_of(self, rank: int) -> str | None:
        return self.slots[rank].host.name if 0 <= rank < self.num_proc else None

    def pid(self, rank: int) -> int:
        """The process id of a rank on this machine."""
        return self._local.pid(rank)

    # -- start ------------------------------------------------------------------------------
    def start(self) -> None:
        """Reach every remote host, then start every rank.

        Raises:
            WorkerFailedError: a host cannot be reached or cannot run hora (nothing was started).
            ConfigError: a host name does not resolve, or lacks ``--network-interface``.
        """
        cfg, plan = self.config, self.plan
        remote_hosts = [h for h in self._by_host if h in plan.addresses]
        advertise = {h: plan.local_address for h in self._by_host if h not in plan.addresses}
        if plan.interface is None:
            advertise.update(plan.addresses)
        for h in remote_hosts:
            self._ssh[h] = SshHost(h, cfg.ssh, cfg.remote_python, functools.partial(self._on_event, h),
                                   functools.partial(self.service.emit_host, h))
            self._ssh[h].connect()
        deadline = time.monotonic() + cfg.start_timeout
        for h in remote_hosts:
            try:
                self._ssh[h].wait_hello(max(0.1, deadline - time.monotonic()))
            except HostUnreachable as exc:
                first = self._by_host[h][0].rank
                raise WorkerFailedError(exc.text, rank=first, host=h, exitcode=exc.code) from None
            if plan.interface is not None:
                advertise[h] = self._remote_interface(h)
        for s in self.slots:
            self._procs[s.rank] = self.make_rank(s, advertise[s.host.name], s.host.name in self._ssh)
        for h, host in self._ssh.items():
            host.send(op="plan", cwd=os.getcwd(), grace=cfg.grace, heartbeat_timeout=cfg.heartbeat_timeout,
                      ranks=[{"rank": s.rank, "argv": list(self._procs[s.rank].argv),
                              "env": dict(self._procs[s.rank].env), "stdin": remote.b64(self._procs[s.rank].stdin)}
                             for s in self._by_host[h]])
            threading.Thread(target=self._watch_session, args=(h,), name=f"hora-session-{h}", daemon=True).start()
        for s in self.slots:
            if s.host.name in self._ssh:
                continue
            rp = self._procs[s.rank]
            proc = self._local.start(s.rank, rp.argv, rp.env, stdin_data=rp.stdin, die_with_parent=True,
                                     warm=rp.warm, warm_command=rp.warm_command)
            threading.Thread(target=self._watch_local, args=(s.rank, proc), name=f"hora-wait-{s.rank}",
                             daemon=True).start()

    def _remote_interface(self, host: str) -> str:
        table = (self._ssh[host].hello or {}).get("interfaces") or {}
        addrs = table.get(self.plan.interface)
        if not addrs:
            raise ConfigError(f"--network-interface {self.plan.interface!r}: host {host} has no such interface "
                              f"with an address (its interfaces: {', '.join(sorted(table)) or 'none'})")
        return addrs[0]

    # -- events -----------------------------------------------------------------------------
    def _record_exit(self, rank: int, code: int, seq: int | None) -> None:
        with self._lock:
            self._exits[rank] = code
            if seq is not None:
                self._failures.append(Failure.from_exit(seq, rank, self._host_label(rank), code,
                                                        self.output.traceback_of(rank)))

    def _host_label(self, rank: int) -> str:
        """How messages name a rank's host: as given for a remote host, the address its
        ranks advertise for this machine (what the rank's own reports say)."""
        host = self.slots[rank].host
        return host.name if host.name in self.plan.addresses else self.plan.local_address

    def _watch_local(self, rank: int, proc: Any) -> None:
        code = proc.wait()
        seq = self.service.next_seq() if code != 0 and not self._cancelled else None
        self._local.wait_output(rank, DRAIN_TIMEOUT)
        self._record_exit(rank, code, seq)

    def _on_event(self, host: str, event: dict[str, Any]) -> None:
        kind = event.get("ev")
        rank = event.get("rank")
        if kind == "line":
            self.output(int(rank), str(event.get("stream")), str(event.get("text", "")))
        elif kind == "exit":
            code = int(event["code"])
            seq = self.service.next_seq() if code != 0 and not self._cancelled else None
            with self._lock:
                self._remote_exit[int(rank)] = (code, seq)
        elif kind == "drained":
            with self._lock:
                code, seq = self._remote_exit.get(int(rank), (0, None))
            self._record_exit(int(rank), code, seq)
        elif kind == "error":
            first = int(rank) if rank is not None else self._by_host[host][0].rank
            if not self._cancelled:
                with self._lock:
                    self._failures.append(Failure(seq=self.service.next_seq(), rank=first, host=host,
                                                  message=f"could not start on {host}: {event.get('text')}"))
        elif kind == "warning":
            self.service.emit_host(host, "stderr", f"hora: {event.get('text')}")

    def _watch_session(self, host: str) -> None:
        ssh = self._ssh[host]
        ssh.wait_closed(1e9)
        if self._cancelled:
            return
        with self._lock:
            left = [s.rank for s in self._by_host[host] if s.rank not in self._exits]
        if not left:
            return
        time.sleep(0.2)  # events read just before the end are handled
        if self._cancelled:
            return
        code = ssh.exit_code()
        with self._lock:
            left = [s.rank for s in self._by_host[host] if s.rank not in self._exits]
            if left:
                self._failures.append(Failure.lost(self.service.next_seq(), left[0], host,
                                                   f"was lost: {ssh.failure_text(code)}", exitcode=code))

    # -- Job ----------------------------------------------------------------------------------
    def failures(self) -> list[Failure]:
        now = time.monotonic()
        for host, ssh in self._ssh.items():
            if (host not in self._lost and not self._cancelled and ssh.exit_code() is None
                    and now - ssh.last_heard > self.config.heartbeat_timeout):
                self._lost.add(host)
                with self._lock:
                    left = [s.rank for s in self._by_host[host] if s.rank not in self._exits]
                    self._failures.append(Failure.lost(
                        self.service.next_seq(), left[0] if left else self._by_host[host][0].rank, host,
                        f"was lost: no word from host {host} for {self.config.heartbeat_timeout:g}s "
                        "(HORA_HEARTBEAT_TIMEOUT)"))
        with self._lock:
            return list(self._failures)

    def ended(self) -> set[int]:
        with self._lock:
            return {r for r, code in self._exits.items() if code == 0}

    def exit_codes(self) -> dict[int, int]:
        """The exit code of every rank that ended so far."""
        with self._lock:
            return dict(self._exits)

    def poll(self) -> list[Any] | None:
        with self._lock:
            if len(self._exits) < self.num_proc or any(self._exits.values()):
                return None
        if not self.functions:
            return [0] * self.num_proc
        from hora.runners.rank.supervise import read_result

        out = []
        for rank in range(self.num_proc):
            path = self._procs[rank].result_path
            out.append(read_result(path) if path else self.service.result(rank))
        return out

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        for ssh in self._ssh.values():
            ssh.stop()
        self._local.terminate(self.config.grace)
        wait_until = time.monotonic() + self.config.grace + DRAIN_TIMEOUT + 3.0
        for host, ssh in self._ssh.items():
            if not ssh.wait_closed(wait_until - time.monotonic()):
                log.warning("host %s did not confirm that its ranks stopped; ending its ssh session", host)
            ssh.kill()
        self.output.close()
        shutil.rmtree(self._tmpdir, ignore_errors=True)


ENV_REMOTE_PYTHON = "HORA_REMOTE_PYTHON"  # the interpreter on remote hosts (default: this one's path)


ENV_WARM_LOCAL = "HORA_WARM_LOCAL"


def warm_local_env(run_env: Mapping[str, str]) -> dict[str, str] | None:
    """Whether the function ranks a launcher starts on this machine fork from a warm server
    (``HORA_WARM_LOCAL``, and ``HORA_WARM_WORKERS``, in this process's or the run's
    environment ``run_env``): the run's variables that key the server (those outside
    ``HORA_*``, which a rank sets before its imports), or None for fresh processes.

    A warm rank has torch, ``torch._dynamo`` and hora's op layer imported already (2-5 s of
    a fresh rank's start). The server is this process's (it ends with it, or after
    ``HORA_WARM_IDLE_TIMEOUT`` s without ranks) and is reused by every later run with the
    same interpreter, working folder and environment; one that cannot start means fresh
    processes (a logged warning).
    """
    from hora.runners.rank.warm import client as warm

    merged = {**os.environ, **run_env}
    if not settings.get(ENV_WARM_LOCAL, merged) or not warm.enabled(merged):
        return None
    return {k: v for k, v in run_env.items() if not k.startswith("HORA_")}


def hosts_config(ssh: SshOptions, python: str | None, start_timeout: float) -> HostsConfig:
    """A :class:`HostsConfig` from the arguments and ``HORA_REMOTE_PYTHON``,
    ``HORA_TERMINATE_GRACE``, ``HORA_HEARTBEAT_TIMEOUT``."""
    return HostsConfig(
        ssh=ssh,
        remote_python=python or settings.get(ENV_REMOTE_PYTHON) or sys.executable,
        start_timeout=start_timeout,
        grace=float(settings.get(ENV_TERMINATE_GRACE)),
        heartbeat_timeout=float(settings.get(ENV_HEARTBEAT_TIMEOUT)),
    )


class HostsLauncher(Launcher):
    """Ranks as processes on hosts: this machine directly, every other host over ssh.

    Args:
        hosts: ``"a:2,b:2"`` or a list of :class:`~hora.runners.slots.HostSlots`
            (default: this machine, one slot per rank).
        hostfile: a host file instead of ``hosts``.
        ssh: how to reach remote hosts (default: ``HORA_SSH_ARGS`` only).
        python: the interpreter of the ranks (default ``HORA_REMOTE_PYTHON`` on remote
            hosts, this interpreter here).
        network_interface: every host advertises this interface's address.
        network_address: the address of this machine the driver service binds.
        output_dir: also write each rank's output to ``<dir>/rank.<r>/stdout|stderr``.

    Raises:
        ConfigError: malformed hosts or host file, a bad ssh option.
    """

    name = "hosts"

    def __init__(self, hosts: str | Sequence[HostSlots] | None = None, *, hostfile: str | None = None,
                 ssh: SshOptions | None = None, python: str | None = None, network_interface: str | None = None,
                 network_address: str | None = None, output_dir: str | None = None) -> None:
        self.output_dir = os.path.abspath(output_dir) if output_dir else None
        self._hosts = resolve_hosts(hosts, hostfile, 1) if (hosts is not None or hostfile is not None) else None
        self.ssh = ssh or SshOptions.from_environ()
        self.python = python
        self.network_interface = network_interface
        self.network_address = network_address
        self._plan: HostPlan | None = None

    def hosts_for(self, num_proc: int) -> list[HostSlots]:
        """The hosts of a run of ``num_proc`` ranks."""
        return list(self._hosts) if self._hosts is not None else [HostSlots("localhost", num_proc)]

    def default_num_proc(self) -> int:
        return sum(h.slots for h in self._hosts) if self._hosts is not None else (os.cpu_count() or 1)

    def plan(self, num_proc: int) -> HostPlan:
        """Assign ranks and choose addresses (once per launcher and size).

        Raises:
            ConfigError: more ranks than slots, unresolvable hosts, bad network options.
        """
        if self._plan is None or len(self._plan.slots) != num_proc:
            self._plan = HostPlan.make(self.hosts_for(num_proc), num_proc, self.ssh,
                                       interface=self.network_interface, address=self.network_address)
        return self._plan

    def check_num_proc(self, num_proc: int) -> None:
        self.plan(num_proc)

    def driver_addresses(self) -> tuple[str, str]:
        if self._plan is None:
            self.plan(self.default_num_proc())
        assert self._plan is not None
        return self._plan.bind, self._plan.service_address

    def _python(self) -> str:
        """The interpreter of the ranks on this machine."""
        return worker_argv("", self.python)[0]

    def prestart(self, num_proc: int, env: Mapping[str, str]) -> None:
        """Start, in the background, the warm rank server this machine's ranks of a run with
        the environment ``env`` will fork from (:func:`warm_local_env`); nothing when every
        rank is remote or warm local ranks are off. Never raises."""
        try:
            hosts = self.hosts_for(num_proc)
        except Exception as exc:  # noqa: BLE001 - start() reports a bad host list
            log.debug("no prestart of the local ranks' warm server: %s", exc)
            return
        import_env = warm_local_env(env)
        if import_env is None or not any(h.is_local for h in hosts):
            return
        from hora.runners.rank.warm import client as warm

        warm.prestart(self._python(), worker_process_env(), None, import_env)

    def start(self, spec: LaunchSpec, service: DriverService) -> Job:
        plan = self.plan(spec.num_proc)
        config = hosts_config(self.ssh, self.python, spec.start_timeout)
        output = RankOutput(service.emit, self.output_dir, spec.num_proc)
        warm_env = warm_local_env(spec.env_dict)  # this machine's ranks fork from a warm server
        job: HostsJob | None = None

        def make_rank(slot: RankSlot, advertise: str, remote: bool) -> RankProcess:
            ctx = RankContext(placement=dataclasses.replace(slot.placement, size=spec.num_proc, host=advertise),
                              rendezvous_addr=service.addr)
            stdin = pickle.dumps((spec, ctx))
            if remote:
                env = forward_environment(os.environ)
                env["PYTHONUNBUFFERED"] = "1"
                return RankProcess(slot.rank, tuple(worker_argv(TO_DRIVER, config.remote_python)), env, stdin)
            assert job is not None
            path = os.path.join(job.tmpdir, f"rank.{slot.rank}.pkl")
            return RankProcess(slot.rank, tuple(worker_argv(path, self.python)), worker_process_env(), stdin, path,
                               warm=warm_env)

        job = HostsJob(plan, make_rank, service, output=output, config=config, functions=True, name=spec.run_id)
        return start_or_cancel(job)


__all__ = ["HostsLauncher", "hosts_config", "warm_local_env", "ENV_WARM_LOCAL", "ENV_REMOTE_PYTHON", "HostsJob", "HostPlan", "HostsConfig", "RankProcess", "RankFactory", "RankOutput", "forward_environment"]
