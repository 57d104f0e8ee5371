"""Ranks through ``mpiexec`` (MPICH's Hydra): ``hora run --mpi`` and ``hora.run(use_mpi=True)``.

The command line passes the hosts as Hydra takes them (``-hosts a:2,b:2``) and, when a
host is not this machine, Hydra's ssh launcher with hora's ssh options (port, identity
file, ``StrictHostKeyChecking=no``, ``HORA_SSH_ARGS``) through a small private wrapper
script (``-launcher ssh -launcher-exec``). Hydra forwards the whole environment to every
rank (its default, ``-genvall``); ``-wdir`` is the launcher's working directory.

Hydra prefixes every *chunk* a rank writes (not every line) with ``-prepend-pattern``;
:class:`ChunkJoiner` puts each rank's pieces back together into whole lines.
"""

from __future__ import annotations

import collections
import os
import pickle
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hora.errors import ConfigError
from hora.native.build_info import find_mpiexec
from hora.native.rendezvous import ENV_BACKEND, ENV_SECRET
from hora.runners.launcher import Job, Launcher, start_or_cancel
from hora.runners.launchers.hosts import HostPlan
from hora.runners.slots import HostSlots
from hora.runners.driver.monitor import Failure
from hora.runners.rank.procs import ProcessLauncher, describe_exit
from hora.runners.spec import ENV_DRIVER_ADDR, ENV_RUN_ID, ENV_SUPERVISOR_PID
from hora.runners.rank.ssh import SshOptions

if TYPE_CHECKING:
    from hora.runners.driver.service import DriverService
    from hora.runners.launchers.hosts import RankOutput
    from hora.runners.spec import LaunchSpec

# ASCII separators that program output does not contain mark where each chunk starts
CHUNK_START, CHUNK_RANK_END = "\x1e", "\x1f"


class ChunkJoiner:
    """Reassembles per-rank lines from one mpiexec stream of marked chunks."""

    def __init__(self, emit: Callable[[int, str], None]) -> None:
        self._emit = emit
        self._rank = -1  # rank of the chunk being read; -1: mpiexec's own output
        self._partial: dict[int, str] = collections.defaultdict(str)

    def feed_line(self, line: str) -> None:
        """Take one newline-terminated line of the stream (without the newline)."""
        head, *chunks = line.split(CHUNK_START)
        self._partial[self._rank] += head
        for chunk in chunks:
            rank, sep, text = chunk.partition(CHUNK_RANK_END)
            if sep and rank.isdigit():
                self._rank = int(rank)
                self._partial[self._rank] += text
            else:  # not a marker after all: keep the text as it was
                self._partial[self._rank] += CHUNK_START + chunk
        # the newline belongs to the chunk read last
        self._emit(self._rank, self._partial.pop(self._rank))


def mpiexec_path() -> str:
    """The mpiexec to use.

    Raises:
        ConfigError: none is installed.
    """
    path = find_mpiexec()
    if path is None:
        raise ConfigError("--mpi needs mpiexec on PATH (pip install mpich, or install an MPI)")
    return path


def mpiexec_argv(mpiexec: str, num_proc: int, command: Sequence[str], hosts: Sequence[HostSlots], workdir: str, *,
                 ssh_wrapper: str | None = None, interface: str | None = None,
                 extra_args: Sequence[str] = ()) -> list[str]:
    """The mpiexec command line (see the module docstring); ``hosts`` may all be local,
    ``ssh_wrapper`` (from :func:`write_ssh_wrapper`) is needed when one is not."""
    argv = [mpiexec, "-n", str(num_proc), "-prepend-pattern", f"{CHUNK_START}%r{CHUNK_RANK_END}"]
    if any(not h.is_local for h in hosts) or len(hosts) > 1:
        argv += ["-hosts", ",".join(f"{h.name}:{h.slots}" for h in hosts)]
    if any(not h.is_local for h in hosts):
        if ssh_wrapper is None:
            raise ConfigError("mpiexec needs an ssh wrapper to reach the remote hosts")
        argv += ["-launcher", "ssh", "-launcher-exec", ssh_wrapper]
    if interface:
        argv += ["-iface", interface]
    argv += ["-wdir", workdir, *extra_args, *command]
    return argv


def write_ssh_wrapper(folder: str, ssh: SshOptions) -> str:
    """A script that runs ssh with hora's options (Hydra's ``-launcher-exec`` takes one path)."""
    path = os.path.join(folder, "ssh")
    with open(path, "w") as fh:
        fh.write(f"#!/bin/sh\nexec ssh {ssh.ssh_args_for_launcher()} \"$@\"\n")
    os.chmod(path, 0o700)
    return path


class MpiJob(Job):
    """One mpiexec process running every rank; its exit code is the job's outcome.

    Args:
        command: what every rank runs.
        hosts: where (all local: no ``-hosts``).
        ssh: how Hydra reaches remote hosts.
        env: mpiexec's environment (forwarded to every rank).
        output: the sink of the ranks' lines.
        service: the driver service (failure counter, function results).
        num_proc: the number of ranks.
        functions: ranks are hora workers whose values :meth:`poll` returns.
        interface: ``-iface`` for Hydra.
        extra_args: more mpiexec arguments (``mpi_args`` of :func:`hora.run`).

    Raises:
        ConfigError: no mpiexec.
    """

    def __init__(self, command: Sequence[str], hosts: Sequence[HostSlots], ssh: SshOptions, env: Mapping[str, str],
                 output: RankOutput, service: DriverService, num_proc: int, functions: bool,
                 interface: str | None = None, extra_args: Sequence[str] = ()) -> None:
        remote = sorted({h.name for h in hosts if not h.is_local})
        if remote and service.tls is not None:
            raise NotImplementedError(
                f"TLS with mpiexec on other hosts ({', '.join(remote)}): mpiexec's own connections between hosts "
                "(MPICH hydra's proxies, which carry the ranks' environment and output) are not encrypted by hora; "
                "run hora's own launcher (hora run without --mpi, hora.run without use_mpi), whose channels are TLS")
        self.output = output
        self.service = service
        self.num_proc = num_proc
        self.functions = functions
        mpiexec = mpiexec_path()
        self._tmpdir = tempfile.mkdtemp(prefix="hora-mpi-")
        os.chmod(self._tmpdir, 0o700)
        wrapper = write_ssh_wrapper(self._tmpdir, ssh) if any(not h.is_local for h in hosts) else None
        self.argv = mpiexec_argv(mpiexec, num_proc, command, hosts, os.getcwd(), ssh_wrapper=wrapper,
                                 interface=interface, extra_args=extra_args)
        self.env = dict(env)
        self.env["PATH"] = os.path.dirname(self.argv[0]) + os.pathsep + self.env.get("PATH", "")
        self._joiners = {s: ChunkJoiner(lambda rank, text, s=s: self._emit(s, rank, text)) for s in ("stdout", "stderr")}
        self._proc = ProcessLauncher(lambda _r, stream, line: self._joiners[stream].feed_line(line))
        self._failure: Failure | None = None
        self._cancelled = False
        self._ssh = ssh
        self._remote_first_rank: dict[str, int] = {}
        first = 0
        for h in hosts:
            if not h.is_local and h.name not in self._remote_first_rank:
                self._remote_first_rank[h.name] = first
            first += h.slots

    def _emit(self, stream: str, rank: int, text: str) -> None:
        if rank < 0:
            self.service.emit_host("mpiexec", stream, text)
        else:
            self.output(rank, stream, text)

    def start(self) -> None:
        """Start mpiexec.

        Raises:
            ConfigError: it cannot be started.
            WorkerFailedError: a remote host cannot be reached over ssh (named, in ssh's
                words, before mpiexec starts: Hydra may exit before it relays them).
        """
        if self._remote_first_rank:
            from hora.errors import WorkerFailedError
            from hora.runners.rank.ssh import HostUnreachable, check_reachable

            try:
                check_reachable(list(self._remote_first_rank), self._ssh, self._ssh.connect_timeout + 5.0)
            except HostUnreachable as exc:
                raise WorkerFailedError(exc.text, rank=self._remote_first_rank[exc.host], host=exc.host,
                                        exitcode=exc.code) from None
        self._proc.start(0, self.argv, self.env, die_with_parent=True)

    def failures(self) -> list[Failure]:
        code = self._proc.poll().get(0)
        if code not in (None, 0) and self._failure is None and not self._cancelled:
            seq = self.service.next_seq()
            self._proc.wait_output(0, 5.0)
            with_tb = [r for r in range(self.num_proc) if (self.output.traceback_of(r) or "").startswith("Traceback")]
            rank = with_tb[0] if with_tb else None
            self._failure = Failure(seq=seq, rank=rank, host=None, message=f"failed (mpiexec exited with {describe_exit(code)})",
                                    traceback=self.output.traceback_of(rank) if rank is not None else None,
                                    exitcode=code)
        return [self._failure] if self._failure is not None else []

    def poll(self) -> list[Any] | None:
        if self._proc.poll().get(0) != 0:
            return None
        self._proc.wait_output(0, 5.0)
        if not self.functions:
            return [0] * self.num_proc
        return [self.service.result(r) for r in range(self.num_proc)]

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        self._proc.terminate(5.0)
        self.output.close()
        shutil.rmtree(self._tmpdir, ignore_errors=True)

    def describe(self) -> str:
        """The command line, for ``--verbose``."""
        return shlex.join(self.argv)


class MpiLauncher(Launcher):
    """Ranks of a function through mpiexec (``hora.run(..., use_mpi=True)``).

    Each rank is ``python -m hora.runners.rank.main --from-driver``: it fetches the spec from
    the driver service (whose address and the job secret reach it in its environment,
    as Horovod's run function mode does), joins MPI, and posts its value back.

    Args:
        hosts: where ranks run (default this machine).
        ssh: how Hydra reaches remote hosts.
        python: the interpreter of the ranks (default this one).
        extra_args: more mpiexec arguments.
        interface: ``-iface`` for Hydra.
        output_dir: also write each rank's output to ``<dir>/rank.<r>/stdout|stderr``.
    """

    name = "mpi"

    def __init__(self, hosts: Sequence[HostSlots] | None = None, *, ssh: SshOptions | None = None,
                 python: str | None = None, extra_args: Sequence[str] = (), interface: str | None = None,
                 output_dir: str | None = None) -> None:
        mpiexec_path()
        self.hosts = list(hosts) if hosts is not None else None
        self.ssh = ssh or SshOptions.from_environ()
        self.python = python or sys.executable
        self.extra_args = tuple(extra_args)
        self.interface = interface
        self.output_dir = output_dir
        self._plan: HostPlan | None = None

    def _hosts_for(self, num_proc: int) -> list[HostSlots]:
        return self.hosts if self.hosts is not None else [HostSlots("localhost", num_proc)]

    def default_num_proc(self) -> int:
        return sum(h.slots for h in self.hosts) if self.hosts else (os.cpu_count() or 1)

    def check_num_proc(self, num_proc: int) -> None:
        self._plan = HostPlan.make(self._hosts_for(num_proc), num_proc, self.ssh, interface=self.interface)

    def driver_addresses(self) -> tuple[str, str]:
        if self._plan is None:
            self.check_num_proc(self.default_num_proc())
        assert self._plan is not None
        return self._plan.bind, self._plan.service_address

    def start(self, spec: LaunchSpec, service: DriverService) -> Job:
        from hora.native import keys
        from hora.runners.launchers.hosts import RankOutput
        from hora.runners.rank.main import FROM_DRIVER
        from hora.runners.rank.supervise import worker_argv

        service.server.set(keys.SPEC, pickle.dumps(spec))
        env = dict(os.environ)
        env.update({ENV_DRIVER_ADDR: spec.driver_addr, ENV_SECRET: spec.secret.hex(),
                    ENV_RUN_ID: spec.run_id, ENV_BACKEND: "mpi", "PYTHONUNBUFFERED": "1"})
        env.pop(ENV_SUPERVISOR_PID, None)
        if spec.tls is not None:  # the ranks fetch the spec over TLS: they pin the certificate first
            from hora.native.rendezvous.tls import ENV_TLS_CERT

            env[ENV_TLS_CERT] = spec.tls.to_text()
        output = RankOutput(service.emit, self.output_dir, spec.num_proc)
        job = MpiJob(worker_argv(FROM_DRIVER, self.python), self._hosts_for(spec.num_proc), self.ssh, env, output,
                     service, spec.num_proc, functions=True, interface=self.interface, extra_args=self.extra_args)
        return start_or_cancel(job)


__all__ = ["ChunkJoiner", "MpiJob", "MpiLauncher", "mpiexec_argv", "mpiexec_path", "CHUNK_START", "CHUNK_RANK_END"]
