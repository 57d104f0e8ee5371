"""The local launcher: ranks as processes on this machine (:class:`LocalLauncher`, a
:class:`~hora.runners.launchers.hosts.HostsLauncher` of one host), on the same code path
as ``hora run``; and the check of a command's Python before ``hora run`` starts it.

Each rank is ``python -m hora.runners.rank.main`` in its own process group with the
(pickled) spec on its stdin; on this machine it writes its value to a private file, on
another host it posts it to the driver service. A function rank on this machine is forked
from a warm server of this process that has imported torch already (``HORA_WARM_LOCAL``,
:func:`~hora.runners.launchers.hosts.warm_local_env`), else started afresh. Every rank on this machine advertises
127.0.0.1 when the whole job is on loopback addresses (``HORA_ADVERTISE_ADDR`` overrides).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import NamedTuple

from hora.errors import ConfigError
from hora.runners.launchers.hosts import HostPlan, HostsLauncher

log = logging.getLogger(__name__)

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


__all__ = ["LocalLauncher", "check_command_python",
           "command_python", "PythonCheck", "FRAMEWORKS"]
