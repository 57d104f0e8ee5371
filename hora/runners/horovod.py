"""``hora.run``: Horovod's ``horovod.run`` (``horovod.runner.run``), same signature.

>>> import hora
>>> def train(lr):
...     import hora.torch as hvd
...     hvd.init()
...     return hvd.rank()
>>> hora.run(train, args=(0.1,), num_proc=2)                      # [0, 1]
>>> hora.run(train, args=(0.1,), num_proc=4, hosts="a:2,b:2")      # over ssh

As in Horovod, ``func`` calls ``hvd.init()`` itself; its return values come back in
rank order. hora's own launcher (Gloo) is the default; ``use_mpi=True`` goes through
mpiexec. Elastic mode (``min_num_proc``, ``host_discovery_script``, ...) is not in
``hora.run``: those arguments raise :class:`~hora.errors.ConfigError` naming them.
"""

from __future__ import annotations

import shlex
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from hora.errors import ConfigError
from hora.native.rendezvous import ENV_BACKEND

def run(
    func: Callable[..., Any],
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    num_proc: int = 1,
    min_num_proc: int | None = None,
    max_num_proc: int | None = None,
    slots: int | None = None,
    reset_limit: int | None = None,
    cooldown_range: tuple[int, int] | None = None,
    hosts: str | None = None,
    hostfile: str | None = None,
    host_discovery_script: str | None = None,
    start_timeout: float | None = None,
    ssh_port: int | None = None,
    ssh_identity_file: str | None = None,
    disable_cache: bool | None = None,
    output_filename: str | None = None,
    verbose: int | None = None,
    use_gloo: bool | None = None,
    use_mpi: bool | None = None,
    mpi_args: str | None = None,
    network_interface: str | None = None,
    network_interfaces: Iterable[str] | None = None,
    executable: str | None = None,
    np: int | None = None,
    min_np: int | None = None,
    max_np: int | None = None,
    max_failures: int = 0,
) -> list[Any]:
    """Run ``func(*args, **kwargs)`` on ``num_proc`` ranks and return their values in rank order.

    Args (Horovod's):
        func: a picklable function; it calls ``hvd.init()`` itself.
        args, kwargs: its arguments.
        num_proc: the number of ranks (``np`` is its deprecated spelling).
        hosts: ``"host1:2,host2:2"`` (default ``localhost:num_proc``); hosts other than
            this machine are reached over ssh.
        hostfile: a file of ``host slots=N`` lines instead of ``hosts``.
        start_timeout: seconds for hosts to answer and ranks to start (default
            ``HORA_START_TIMEOUT`` or 60).
        ssh_port, ssh_identity_file: ssh's ``-p`` and ``-i``.
        disable_cache: accepted; hora checks hosts on every run (it keeps no cache).
        output_filename: also write each rank's output to ``<dir>/rank.<r>/stdout|stderr``.
        verbose: 0 quiet, 1 (default) rank output, 2 also debug logs in the ranks.
        use_gloo, use_mpi: the launcher and controller: hora's own with Gloo (default) or mpiexec.
        mpi_args: more mpiexec arguments (with ``use_mpi``).
        network_interfaces: the interface every host communicates on (the first one is
            used; ``network_interface`` is the deprecated comma-separated spelling).
        executable: the Python of the ranks (default this interpreter's path, on every host).
        min_num_proc, max_num_proc, slots, reset_limit, cooldown_range,
        host_discovery_script, min_np, max_np: elastic mode, not in ``hora.run``.

    Args (hora's):
        max_failures: relaunch every rank up to this many times when a rank is killed or a
            host is lost (not when ``func`` raises); ``func`` sees ``HORA_ATTEMPT`` (1, 2, ...)
            and resumes from its own checkpoint. See :func:`hora.runners.run`.

    Raises:
        ConfigError: conflicting or unsupported arguments (named), bad hosts.
        WorkerFailedError: a rank failed (rank, host, exit code, remote traceback).
        RendezvousError: a rank never started within ``start_timeout``.
    """
    from hora.runners import base
    from hora.runners.hosts import resolve_hosts
    from hora.runners.ssh import SshOptions

    if np is not None:
        warnings.warn("np is deprecated, use num_proc instead", DeprecationWarning, stacklevel=2)
        num_proc = np
    if network_interface:
        warnings.warn("network_interface is deprecated, use network_interfaces instead", DeprecationWarning,
                      stacklevel=2)
        network_interfaces = network_interface.split(",")
    given = {"min_num_proc": min_num_proc, "max_num_proc": max_num_proc, "slots": slots, "reset_limit": reset_limit,
             "cooldown_range": cooldown_range, "host_discovery_script": host_discovery_script, "min_np": min_np,
             "max_np": max_np}
    elastic = [k for k, v in given.items() if v is not None]
    if elastic:
        raise ConfigError(f"hora.run: {', '.join(elastic)} (Horovod's elastic mode) is not supported; elastic "
                          "training is `hora run --min-np M --max-np N --host-discovery-script S`; here, run with a "
                          "fixed num_proc and max_failures=N to relaunch every rank after a lost one")
    if hosts is not None and hostfile is not None:
        raise ConfigError("hora.run: give hosts or hostfile, not both")
    if use_gloo and use_mpi:
        raise ConfigError("hora.run: use_gloo and use_mpi cannot both be True")
    if use_mpi and max_failures:
        raise ConfigError("hora.run: max_failures needs hora's own launcher: under use_mpi, mpiexec does not say "
                          "which rank died or how")
    if mpi_args and not use_mpi:
        raise ConfigError("hora.run: mpi_args needs use_mpi=True")
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ConfigError(f"hora.run: num_proc must be an int >= 1, got {num_proc!r}")
    nics = list(network_interfaces or [])
    host_list = resolve_hosts(hosts, hostfile, num_proc)
    ssh = SshOptions.from_environ(port=ssh_port, identity_file=ssh_identity_file)
    if use_mpi:
        from hora.runners.mpi import MpiLauncher

        launcher: base.Launcher = MpiLauncher(host_list, ssh=ssh, python=executable,
                                              extra_args=shlex.split(mpi_args or ""),
                                              interface=nics[0] if nics else None, output_dir=output_filename)
    else:
        from hora.runners.local import HostsLauncher

        launcher = HostsLauncher(host_list, ssh=ssh, python=executable,
                                 network_interface=nics[0] if nics else None, output_dir=output_filename)
    level = 1 if verbose is None else max(0, min(2, int(verbose)))
    return base.run(func, args=tuple(args), kwargs=dict(kwargs or {}), num_proc=num_proc, backend=launcher,
                    start_timeout=start_timeout, verbose=level, init_native=False, max_failures=max_failures,
                    env={ENV_BACKEND: "mpi"} if use_mpi else None)


__all__ = ["run"]
