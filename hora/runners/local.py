"""Launchers of rank processes: this machine (:class:`LocalLauncher`) and a list of hosts
reached over ssh (:class:`HostsLauncher`), on the same code path as ``hora run``.

Each rank is ``python -m hora.runners.worker`` in its own process group with the
(pickled) spec on its stdin; on this machine it writes its value to a private file, on
another host it posts it to the driver service. Every rank on this machine advertises
127.0.0.1 when the whole job is on loopback addresses (``HORA_ADVERTISE_ADDR`` overrides).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import NamedTuple

from hora import settings
from hora.errors import ConfigError
from hora.runners.base import Job, Launcher, start_or_cancel
from hora.runners.driver import DriverService
from hora.runners.hostjob import HostPlan, HostsConfig, HostsJob, RankOutput, RankProcess, forward_environment
from hora.runners.hosts import HostSlots, RankSlot, resolve_hosts
from hora.runners.spec import (
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_TERMINATE_GRACE,
    ENV_HEARTBEAT_TIMEOUT,
    ENV_TERMINATE_GRACE,
    LaunchSpec,
    RankContext,
    env_seconds,
)
from hora.runners.ssh import SshOptions
from hora.runners.worker import TO_DRIVER, worker_argv, worker_process_env

log = logging.getLogger(__name__)

ENV_REMOTE_PYTHON = "HORA_REMOTE_PYTHON"  # the interpreter on remote hosts (default: this one's path)


def hosts_config(ssh: SshOptions, python: str | None, start_timeout: float) -> HostsConfig:
    """A :class:`HostsConfig` from the arguments and ``HORA_REMOTE_PYTHON``,
    ``HORA_TERMINATE_GRACE``, ``HORA_HEARTBEAT_TIMEOUT``."""
    return HostsConfig(
        ssh=ssh,
        remote_python=python or settings.get(ENV_REMOTE_PYTHON) or sys.executable,
        start_timeout=start_timeout,
        grace=env_seconds(ENV_TERMINATE_GRACE, DEFAULT_TERMINATE_GRACE),
        heartbeat_timeout=env_seconds(ENV_HEARTBEAT_TIMEOUT, DEFAULT_HEARTBEAT_TIMEOUT),
    )


class HostsLauncher(Launcher):
    """Ranks as processes on hosts: this machine directly, every other host over ssh.

    Args:
        hosts: ``"a:2,b:2"`` or a list of :class:`~hora.runners.hosts.HostSlots`
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

    def start(self, spec: LaunchSpec, service: DriverService) -> Job:
        plan = self.plan(spec.num_proc)
        config = hosts_config(self.ssh, self.python, spec.start_timeout)
        output = RankOutput(service.emit, self.output_dir, spec.num_proc)
        job: HostsJob | None = None

        def make_rank(slot: RankSlot, advertise: str, remote: bool) -> RankProcess:
            ctx = RankContext(rank=slot.rank, size=spec.num_proc, local_rank=slot.local_rank,
                              local_size=slot.local_size, cross_rank=slot.cross_rank, cross_size=slot.cross_size,
                              hostname=advertise, rendezvous_addr=service.addr)
            stdin = pickle.dumps((spec, ctx))
            if remote:
                env = forward_environment(os.environ)
                env["PYTHONUNBUFFERED"] = "1"
                return RankProcess(slot.rank, tuple(worker_argv(TO_DRIVER, config.remote_python)), env, stdin)
            assert job is not None
            path = os.path.join(job.tmpdir, f"rank.{slot.rank}.pkl")
            return RankProcess(slot.rank, tuple(worker_argv(path, self.python)), worker_process_env(), stdin, path)

        job = HostsJob(plan, make_rank, service, output=output, config=config, functions=True)
        return start_or_cancel(job)


class LocalLauncher(HostsLauncher):
    """Ranks as processes on this machine.

    Args:
        hostname: the address ranks advertise (default ``HORA_ADVERTISE_ADDR`` or 127.0.0.1).
    """

    name = "local"

    def __init__(self, hostname: str | None = None) -> None:
        super().__init__(None)
        self._hostname = hostname

    def plan(self, num_proc: int) -> HostPlan:
        plan = super().plan(num_proc)
        if self._hostname is not None and plan.local_address != self._hostname:
            from hora.runners.network import is_loopback

            bind = "127.0.0.1" if is_loopback(self._hostname) else "0.0.0.0"
            self._plan = plan = HostPlan(plan.slots, {}, bind, self._hostname, self._hostname)
        return plan




# ---------------------------------------------------------------------------------------------
# hora run: can the command's python import hora? (checked on this machine before ranks start)

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")

# prints where `hora` resolves; a namespace package (a folder named hora without __init__.py
# ahead of the installed package) has no __file__
_IMPORT_PROBE = (
    "import sys, importlib.util\n"
    "if sys.argv[2]: sys.path = [sys.argv[2]] + [p for p in sys.path if p != '']  # as for python script.py\n"
    "import hora, json\n"
    "missing = [m for m in sys.argv[1].split(',') if m and importlib.util.find_spec(m) is None]\n"
    "print(json.dumps({'file': getattr(hora, '__file__', None), 'path': list(getattr(hora, '__path__', [])),\n"
    "                  'missing': missing}))\n"
)

#: frameworks a training script imports: when hora run's python has one and the command's does not, say so
FRAMEWORKS = ("torch", "tensorflow", "lightning", "pytorch_lightning", "keras", "pyspark", "dask", "numpy")


def command_python(command: Sequence[str], path: str | None) -> str | None:
    """The interpreter ``command`` starts (its first word resolved on ``path``), or None when
    the command does not start with ``python``/``python3``/``python3.X`` or a path to one.

    Raises:
        ConfigError: the command names a python that is not on ``path`` (or not a file).
    """
    if not command:
        return None
    first = command[0]
    if not _PYTHON_NAME.match(os.path.basename(first)):
        return None
    if os.sep in first:
        if not os.path.isfile(first):
            raise ConfigError(f"the command's interpreter {first} does not exist")
        return os.path.abspath(first)
    found = shutil.which(first, path=path)
    if found is None:
        raise ConfigError(f"the command's {first!r} is not on the ranks' PATH ({path}); hora run itself "
                          f"runs {sys.executable}: run the command as {sys.executable} ... or activate its venv")
    return found


class PythonCheck(NamedTuple):
    """What :func:`check_command_python` found: the command's interpreter, and the frameworks
    (of :data:`FRAMEWORKS`) that ``hora run``'s own interpreter has and it lacks."""

    python: str
    missing: tuple[str, ...]

    def warning(self) -> str | None:
        """A line for the user when ``missing`` is not empty, else None."""
        if not self.missing:
            return None
        return (f"the command's python {self.python} cannot import {', '.join(self.missing)}, which hora run's "
                f"python {sys.executable} has; if the script needs them, run it as {sys.executable} ... or activate "
                "that venv")


def check_command_python(command: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None,
                         timeout: float = 60.0) -> PythonCheck | None:
    """Check, before any rank starts, that the python of ``command`` can import hora as a package.

    ``env`` is the ranks' environment (its PATH resolves the command's first word; default
    this process's). The probe runs ``<python> -c "import hora"`` in ``cwd`` with the
    directory of the command's script first on ``sys.path``, as the ranks will. Returns the
    interpreter checked and the frameworks it lacks (see :class:`PythonCheck`), or None when
    the command does not start a python.

    Raises:
        ConfigError: that python cannot import hora (naming it and :data:`sys.executable`),
            ``hora`` resolves there to a namespace folder (naming the folder), or the probe
            did not answer within ``timeout`` seconds.
    """
    env = dict(os.environ if env is None else env)
    python = command_python(command, env.get("PATH"))
    if python is None:
        return None
    script_dir = ""
    if len(command) > 1 and command[1].endswith(".py"):
        script_dir = os.path.dirname(os.path.abspath(os.path.join(cwd or os.getcwd(), command[1])))
    same = os.path.realpath(python) == os.path.realpath(sys.executable)
    frameworks = [] if same else [m for m in FRAMEWORKS if importlib.util.find_spec(m) is not None]
    argv = [python, "-c", _IMPORT_PROBE, ",".join(frameworks), script_dir]
    try:
        proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{python} -c 'import hora' did not finish within {timeout:.0f}s") from None
    except OSError as exc:
        raise ConfigError(f"cannot start the command's interpreter {python}: {exc}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ConfigError(
            f"the command's python resolves to {python}, which cannot import hora ({last}); hora run "
            f"itself runs {sys.executable}" + ("" if same else
                                              f". Run the command as {sys.executable} ... (e.g. .venv/bin/python "
                                              "train.py) or activate the venv that has hora before hora run"))
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        log.debug("hora probe printed %r", proc.stdout)
        return PythonCheck(python, ())
    if found.get("file") is None:
        folders = ", ".join(dict.fromkeys(found.get("path") or [])) or "(unknown)"
        raise ConfigError(
            f"in {python}, 'import hora' finds the folder {folders} (a namespace package: a folder named "
            "hora without __init__.py, e.g. a store path such as file:///tmp/hora, in the working directory or "
            "next to the script) instead of the installed hora; rename that folder or run from another directory"
            + ("" if same else f" (hora run itself runs {sys.executable})"))
    return PythonCheck(python, tuple(found.get("missing") or ()))


__all__ = ["HostsLauncher", "LocalLauncher", "hosts_config", "ENV_REMOTE_PYTHON", "check_command_python",
           "command_python", "PythonCheck", "FRAMEWORKS"]
