"""The ``hora`` command: ``hora run``, ``hora check``, ``hora timeline summarize``.

``hora run -np N [-H host:slots,... | --hostfile FILE] COMMAND...`` starts N copies of
COMMAND on this machine and, over ssh, on the other hosts, with the ``HORA_*``
environment of a job; every output line is prefixed with its rank
(``[1]<stdout>:...``); when a rank fails every rank on every host is stopped, the first
failure's rank, host, exit code and traceback are printed, and ``hora run`` exits with
its exit code. ``--mpi`` runs the same through ``mpiexec``; ``--max-failures N`` relaunches
every rank after a lost one; ``--host-discovery-script`` (with ``--min-np``/``--max-np``)
makes the run elastic (:mod:`hora.runners.elastic.driver`). The flags are horovodrun's
(see ``hora run --help``); the launching itself is :mod:`hora.runners.command`, this
module only parses arguments and prints.

Exit codes: 0 success, the failing rank's code otherwise (128+N for signal N), 1 for a
rank that never arrived, 2 for usage errors, 255 for a host ssh cannot reach.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence

from hora import ENV_LOG_LEVEL, settings
from hora.errors import ConfigError, HoraError, RendezvousError, WorkerFailedError
from hora.checks import _version, check_build_summary, check_report

EXIT_USAGE = 2
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")

log = logging.getLogger(__name__)


class UsageError(Exception):
    """A bad command line (exit code 2)."""


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP reached ``hora run`` (raised in the main thread)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# --------------------------------------------------------------------------------------
# argument parsing
# --------------------------------------------------------------------------------------
def _number(name: str, kind: type, minimum: float, strict: bool):
    """An argparse type: an int/float > ``minimum`` (``strict``) or >= ``minimum``, naming the option."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{name} must be {what}, got {text!r}") from None
        if not (value > minimum if strict else value >= minimum):
            raise argparse.ArgumentTypeError(f"{name} must be {'>' if strict else '>='} {minimum:g}, got {text}")
        return value

    return parse


def _hora_version() -> str:
    import hora

    return hora.__version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``hora`` command."""
    parser = argparse.ArgumentParser(prog="hora", description="Distributed deep-learning training launcher.")
    parser.add_argument("--version", action="version", version=f"hora {_hora_version()}")
    sub = parser.add_subparsers(dest="cmd", metavar="{run,check,timeline}")

    run = sub.add_parser("run", help="start N processes of a training command on this machine and ssh hosts",
                         description="Start N ranks of COMMAND (horovodrun's flags).")
    run.add_argument("-np", "--num-proc", dest="np", type=_number("-np", int, 1, False), default=None,
                     help="number of ranks")
    run.add_argument("-cb", "--check-build", action="store_true",
                     help="print which frameworks, controllers and tensor operations this install has")
    run.add_argument("--verbose", action="store_true", help="print the rank placement and ssh/mpiexec commands")
    run.add_argument("--log-level", choices=LOG_LEVELS, default=None, type=str.upper,
                     help="level of hora's log messages in the launcher and every rank (HORA_LOG_LEVEL)")
    run.add_argument("--start-timeout", type=_number("--start-timeout", float, 0, True), default=None,
                     help="seconds for hosts to answer and ranks to meet at start (default HORA_START_TIMEOUT or 60)")
    run.add_argument("--max-failures", type=_number("--max-failures", int, 0, False), default=0, metavar="N",
                     help="relaunch every rank up to N times when a rank is killed by a signal or a host is lost "
                          "(not when the program fails); ranks see HORA_ATTEMPT=1,2,... (default 0)")
    run.add_argument("--warm", action="store_true", default=None,
                     help="fork the ranks on this machine whose command is this python (python SCRIPT or python -m "
                          "MODULE) from a server that has imported torch and hora (HORA_WARM_PRELOAD) instead of "
                          "starting each as a fresh interpreter (default: HORA_WARM_COMMANDS, off)")
    run.add_argument("--tls", action="store_true", default=None,
                     help="the driver service and rendezvous in TLS with a certificate made for this run and pinned by "
                          "its ranks (needs hora[tls]; default: HORA_TLS, off)")
    run.add_argument("--output-filename", metavar="DIR", default=None,
                     help="also write each rank's output to DIR/rank.<r>/stdout and stderr")
    run.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp", action="store_true",
                     help="prefix every output line with the time it arrived")
    hosts = run.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", default=None, metavar="HOST:SLOTS,...",
                       help="hosts and their slots (default localhost:NP); other hosts are reached over ssh")
    hosts.add_argument("-hostfile", "--hostfile", default=None, metavar="FILE",
                       help="a file of 'host slots=N' (or 'host:N') lines")
    hosts.add_argument("--host-discovery-script", default=None, metavar="SCRIPT",
                       help="elastic training: SCRIPT prints the usable hosts, one 'host:slots' (or 'host') per "
                            "line; it runs every second and ranks join and leave as its output changes")
    run.add_argument("--network-interface", "--network-interfaces", dest="nic", default=None, metavar="IFACE",
                     help="interface every host communicates on (its address is advertised; Gloo/NCCL use it)")
    run.add_argument("--network-address", default=None, metavar="ADDR",
                     help="address of this machine the launcher's services bind (reachable from every host)")
    ssh = run.add_argument_group("ssh")
    ssh.add_argument("-p", "--ssh-port", type=_number("--ssh-port", int, 1, False), default=None,
                     help="ssh port on every host")
    ssh.add_argument("-i", "--ssh-identity-file", default=None, metavar="FILE", help="ssh private key file")
    ssh.add_argument("--remote-python", default=None, metavar="PATH",
                     help="the Python on remote hosts (default HORA_REMOTE_PYTHON or this interpreter's path)")
    el = run.add_argument_group("elastic training (with --host-discovery-script; horovodrun's flags)")
    el.add_argument("--min-np", "--min-num-proc", dest="min_np", type=_number("--min-np", int, 1, False), default=None,
                    help="fewest ranks training goes on with (default -np)")
    el.add_argument("--max-np", "--max-num-proc", dest="max_np", type=_number("--max-np", int, 1, False),
                    default=None, help="most ranks (default: every discovered slot)")
    el.add_argument("--slots-per-host", type=_number("--slots-per-host", int, 1, False), default=None,
                    help="slots of a host the discovery script prints without ':slots' (default 1)")
    el.add_argument("--elastic-timeout", type=_number("--elastic-timeout", float, 0, True), default=None,
                    help="seconds to wait for --min-np slots after ranks were lost (default HORA_ELASTIC_TIMEOUT "
                         "or 600)")
    el.add_argument("--reset-limit", type=_number("--reset-limit", int, 0, False), default=None,
                    help="the most times the job may re-form with other ranks (default: no limit)")
    el.add_argument("--blacklist-cooldown-range", nargs=2, type=_number("--blacklist-cooldown-range", int, 1, False),
                    default=None, metavar=("MIN", "MAX"),
                    help="seconds a failing host stays blacklisted: from MIN, doubling up to MAX (default: for good)")
    run.add_argument("-x", dest="export", action="append", default=[], metavar="NAME[=VALUE]",
                     help="forward NAME (or set NAME=VALUE) on every rank, as mpirun -x; repeatable")
    ctl = run.add_mutually_exclusive_group()
    ctl.add_argument("--gloo", action="store_true", help="hora's own launcher with Gloo (the default)")
    ctl.add_argument("--mpi", action="store_true", help="run through mpiexec with the MPI backend")
    tune = run.add_argument_group("engine settings (HORA_* variables of every rank)")
    tune.add_argument("--fusion-threshold-mb", type=_number("--fusion-threshold-mb", float, 0, False), default=None)
    tune.add_argument("--cycle-time-ms", type=_number("--cycle-time-ms", float, 0, True), default=None)
    tune.add_argument("--cache-capacity", type=_number("--cache-capacity", int, 0, False), default=None)
    tune.add_argument("--autotune", action="store_true")
    tune.add_argument("--timeline-filename", default=None, metavar="FILE", help="write a Chrome-trace timeline")
    tune.add_argument("--timeline-mark-cycles", action="store_true",
                      help="mark every engine cycle on the timeline (needs --timeline-filename)")
    tune.add_argument("--no-shm", action="store_true",
                      help="ranks on one host allreduce through Gloo instead of shared memory (HORA_SHM_ALLREDUCE=0)")
    tune.add_argument("--backend", default=None, choices=list(settings.BACKENDS),
                      help="collective backend (HORA_BACKEND); default auto")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the command to run (e.g. python train.py)")

    check = sub.add_parser("check", help="show which frameworks, backends, engines and stores are usable here")
    check.add_argument("--env", action="store_true",
                       help="list every HORA_* setting with its current value and default instead")

    st = sub.add_parser("store", help="work with a Store")
    st_sub = st.add_subparsers(dest="store_cmd", metavar="{verify}")
    ver = st_sub.add_parser("verify", help="check a store's datasets and checkpoints against their checksums; "
                                          "exit code 1 when something is damaged")
    ver.add_argument("url", help="the store's URL (file:///path, s3://bucket/prefix, ...)")

    tl = sub.add_parser("timeline", help="work with timelines written by --timeline-filename")
    tl_sub = tl.add_subparsers(dest="timeline_cmd", metavar="{summarize}")
    summ = tl_sub.add_parser("summarize", help="time per phase of a timeline file")
    summ.add_argument("file")
    return parser


# --------------------------------------------------------------------------------------
# hora run
# --------------------------------------------------------------------------------------
def _exports(items: Sequence[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """``-x NAME`` (forwarded if set here; a warning otherwise) and ``-x NAME=VALUE``."""
    names, values = [], {}
    for item in items:
        name, sep, value = item.partition("=")
        if sep:
            values[name] = value
        elif name in os.environ:
            names.append(name)
        else:
            sys.stderr.write(f"hora run: warning: -x {name}: {name} is not set in this environment; not forwarded\n")
    return tuple(names), values


def _settings(args: argparse.Namespace) -> dict[str, str]:
    from hora.runners.spec import native_settings_env

    if args.timeline_mark_cycles and not args.timeline_filename:
        raise UsageError("--timeline-mark-cycles needs --timeline-filename")
    out = native_settings_env(
        timeline=args.timeline_filename,
        timeline_mark_cycles=args.timeline_mark_cycles,
        cycle_time_ms=args.cycle_time_ms,
        fusion_threshold_mb=args.fusion_threshold_mb,
        cache_capacity=args.cache_capacity,
        autotune=args.autotune,
        shm=not args.no_shm,
    )
    if args.log_level:
        out[ENV_LOG_LEVEL] = args.log_level
    return out


def command_config(args: argparse.Namespace):
    """The :class:`~hora.runners.command.CommandConfig` of ``hora run``'s arguments.

    Raises:
        UsageError: a bad flag or combination (named).
    """
    from hora.native.rendezvous import ENV_BACKEND, ENV_START_TIMEOUT
    from hora.runners.command import CommandConfig
    from hora.runners.slots import resolve_hosts
    from hora import settings as registry
    from hora.runners.rank.ssh import SshOptions

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    elastic = args.host_discovery_script is not None
    if not elastic:
        given = [flag for flag, value in (("--min-np", args.min_np), ("--max-np", args.max_np),
                                          ("--slots-per-host", args.slots_per_host),
                                          ("--elastic-timeout", args.elastic_timeout),
                                          ("--reset-limit", args.reset_limit),
                                          ("--blacklist-cooldown-range", args.blacklist_cooldown_range))
                 if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)} need(s) --host-discovery-script (elastic training); a run of "
                             "fixed size survives a lost rank with --max-failures")
    num_proc = args.np if args.np is not None else (args.min_np if elastic else None)
    if num_proc is None:
        raise UsageError("-np is required (the number of ranks)" + (" or --min-np" if elastic else ""))
    try:
        start_timeout = args.start_timeout or settings.get(ENV_START_TIMEOUT)
        forward, values = _exports(args.export)
        output_dir = os.path.abspath(args.output_filename) if args.output_filename else None
        if elastic:
            from hora.runners.elastic.driver import discover_at_start

            hosts = tuple(discover_at_start(args.host_discovery_script, args.slots_per_host, num_proc))
        else:
            hosts = tuple(resolve_hosts(args.hosts, args.hostfile, num_proc))
        return CommandConfig(
            command=tuple(command),
            num_proc=num_proc,
            hosts=hosts,
            ssh=SshOptions.from_environ(port=args.ssh_port, identity_file=args.ssh_identity_file,
                                        connect_timeout=min(10.0, start_timeout)),
            start_timeout=start_timeout,
            settings=_settings(args),
            forward=forward,
            values=values,
            output_dir=output_dir,
            network_interface=args.nic,
            network_address=args.network_address,
            collective="mpi" if args.mpi else (args.backend or registry.get(ENV_BACKEND)).lower(),
            mpi=args.mpi,
            remote_python=args.remote_python,
            verbose=args.verbose,
            max_failures=args.max_failures,
            warm=args.warm,
            tls=args.tls,
        )
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def elastic_config(args: argparse.Namespace, command: object):
    """The :class:`~hora.runners.elastic.driver.ElasticConfig` of ``hora run --host-discovery-script``
    (``command``: its :class:`~hora.runners.command.CommandConfig`).

    Raises:
        UsageError: a bad flag or combination (``--min-np`` above ``--max-np``, ...).
    """
    from hora.runners.elastic.driver import ElasticConfig
    from hora.runners.elastic.membership import ENV_TIMEOUT

    try:
        return ElasticConfig(
            command=command,  # type: ignore[arg-type]
            discovery=args.host_discovery_script,
            min_np=args.min_np if args.min_np is not None else command.num_proc,  # type: ignore[attr-defined]
            max_np=args.max_np,
            slots_per_host=args.slots_per_host,
            elastic_timeout=args.elastic_timeout or settings.get(ENV_TIMEOUT),
            reset_limit=args.reset_limit,
            cooldown_range=tuple(args.blacklist_cooldown_range) if args.blacklist_cooldown_range else None,
        )
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _install_signal_handlers() -> dict[int, object]:
    """The first SIGINT/SIGTERM/SIGHUP raises :class:`Interrupted` in the main thread; later
    ones are ignored so the teardown they started can finish."""
    previous: dict[int, object] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous
    state = {"fired": False}

    def handler(signum, _frame):
        if not state["fired"]:
            state["fired"] = True
            raise Interrupted(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, handler)
    return previous


def _print_failure(exc: WorkerFailedError, started: bool) -> int:
    from hora.runners.rank.procs import shell_exit_code

    sys.stderr.write(f"hora run: {exc.message}" + ("; stopping every rank\n" if started else "\n"))
    if exc.remote_traceback:
        where = f" on {exc.host}" if exc.host else ""
        sys.stderr.write(f"hora run: traceback of rank {exc.rank}{where}:\n{exc.remote_traceback.rstrip()}\n")
    sys.stderr.flush()
    return shell_exit_code(exc.exitcode) if exc.exitcode not in (None, 0) else 1


def run_command(args: argparse.Namespace) -> int:
    """``hora run``: returns the exit code."""
    if args.check_build:
        print(check_build_summary(args.verbose))
        return 0
    from hora.runners.command import CommandRun

    if args.log_level:
        _configure_logging(args.log_level)
    elif args.verbose:
        _configure_logging("INFO")
    cfg = command_config(args)
    elastic = elastic_config(args, cfg) if args.host_discovery_script is not None else None
    if any(h.is_local for h in cfg.hosts):  # the check runs here: hosts over ssh are not probed
        from hora.runners.launchers.local import check_command_python

        try:
            checked = check_command_python(cfg.command, {**os.environ, **cfg.values},
                                           timeout=min(60.0, cfg.start_timeout))
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        if checked is not None and checked.warning():
            sys.stderr.write(f"hora run: warning: {checked.warning()}\n")
    if cfg.output_dir:
        os.makedirs(cfg.output_dir, exist_ok=True)
    previous = _install_signal_handlers()
    runner = None
    try:
        try:
            if elastic is not None:
                from hora.runners.elastic.driver import ElasticRun

                runner = ElasticRun(elastic)
            else:
                runner = CommandRun(cfg)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        if cfg.verbose:
            sys.stderr.write("\n".join(runner.describe()) + "\n")
        try:
            runner.start()
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        runner.wait()
        return 0
    except RendezvousError as exc:  # before WorkerFailedError: RanksNotStartedError is both
        sys.stderr.write(f"hora run: {exc}; stopping all ranks\n")
        return 1
    except WorkerFailedError as exc:
        return _print_failure(exc, started=runner is not None and runner.started)
    except (Interrupted, KeyboardInterrupt) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        sys.stderr.write(f"hora run: received {signal.Signals(signum).name}; stopping all ranks\n")
        return 128 + signum
    finally:
        if runner is not None:
            runner.stop()
        for sig, old in previous.items():
            signal.signal(sig, old)  # type: ignore[arg-type]


def _configure_logging(level: str) -> None:
    import hora

    hora.configure_logging(level)


# --------------------------------------------------------------------------------------
# hora check (what is usable here: hora.checks; this prints it)
# --------------------------------------------------------------------------------------
def check_command() -> int:
    """``hora check``: print the report; always exit 0."""
    import platform

    print(f"hora {_version('hora') or '(source)'} on Python {platform.python_version()} ({sys.executable})")
    section = None
    for sec, name, ok, detail in check_report():
        if sec != section:
            section = sec
            print(f"\n{sec}:")
        print(f"  [{'x' if ok else ' '}] {name:<18} {detail}")
    return 0


def check_env_command() -> int:
    """``hora check --env``: every HORA_* setting, its value here and its default; exit 0."""
    from hora.settings import describe

    rows = describe()
    width = max(len(name) for name, *_ in rows)
    for name, current, default, doc in rows:
        print(f"{name:<{width}}  {current:<18} (default {default})  {doc}")
    return 0


# --------------------------------------------------------------------------------------
# hora timeline
# --------------------------------------------------------------------------------------
def timeline_command(args: argparse.Namespace) -> int:
    """``hora timeline summarize FILE``."""
    if args.timeline_cmd != "summarize":
        raise UsageError("usage: hora timeline summarize FILE")
    try:
        timeline = importlib.import_module("hora.native.timeline")
    except ImportError as exc:
        sys.stderr.write(f"hora timeline: the timeline module is not available in this install: {exc}\n")
        return 1
    summarize = getattr(timeline, "summarize", None)
    if summarize is None:
        sys.stderr.write("hora timeline: hora.native.timeline.summarize is not available in this version\n")
        return 1
    try:
        print(summarize(args.file))
    except HoraError as exc:
        sys.stderr.write(f"hora timeline: {exc}\n")
        return 1
    return 0


# --------------------------------------------------------------------------------------
# hora store
# --------------------------------------------------------------------------------------
def store_command(args: argparse.Namespace) -> int:
    """``hora store verify URL``: print what is damaged; 0 when intact, 1 when damaged or unreadable."""
    if args.store_cmd != "verify":
        raise UsageError("usage: hora store verify URL")
    from hora.store import Store
    from hora.store.verify import verify_store

    try:
        report = verify_store(Store.create(args.url, check_writable=False))
    except HoraError as exc:
        sys.stderr.write(f"hora store verify: {exc}\n")
        return 1
    for damage in report.damaged:
        print(f"DAMAGED {damage.where}: {damage.problem}")
    print(f"{report.url}: {report.datasets} dataset(s), {report.runs} run(s); {report.checked} file(s) verified, "
          f"{report.unverified} without a recorded checksum, {len(report.damaged)} damaged")
    return 0 if report.ok else 1


# --------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hora`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.cmd == "run":
            return run_command(args)
        if args.cmd == "check":
            return check_env_command() if args.env else check_command()
        if args.cmd == "timeline":
            return timeline_command(args)
        if args.cmd == "store":
            return store_command(args)
        parser.print_help()
        return EXIT_USAGE
    except UsageError as exc:
        sys.stderr.write(f"hora {args.cmd}: error: {exc}\n")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
