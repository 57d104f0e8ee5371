"""The ``hora`` command: ``hora run``, ``hora check``, ``hora timeline summarize``.

``hora run -np N COMMAND...`` starts N copies of COMMAND on this machine with the
``HORA_*`` environment of a job (a rendezvous server in the launcher on 127.0.0.1 and a
fresh secret), prefixes every output line with its rank (``[1]<stdout>:...``), and when
a rank fails stops the others, prints the failing rank's traceback and exits with its
exit code. ``--mpi`` runs the same through ``mpiexec``.

Exit codes: 0 success, the failing rank's code otherwise (128+N for signal N), 2 for
usage errors.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

from hora.errors import ConfigError, HoraError
from hora.native.build_info import find_mpiexec

EXIT_USAGE = 2
POLL_INTERVAL = 0.05
START_BARRIER_HINTS = ("start", "init")  # KV barriers watched by `hora run` during start-up

log = logging.getLogger(__name__)


class UsageError(Exception):
    """A bad command line (exit code 2)."""


# --------------------------------------------------------------------------------------
# argument parsing
# --------------------------------------------------------------------------------------
def _positive_int(name: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1, got {value}")
        return value

    return parse


def _float_at_least(name: str, minimum: float, strict: bool):
    """An argparse type: a float > ``minimum`` (``strict``) or >= ``minimum``, naming the option."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not (value > minimum if strict else value >= minimum):
            raise argparse.ArgumentTypeError(f"{name} must be {'>' if strict else '>='} {minimum:g}, got {text}")
        return value

    return parse


def _positive_float(name: str):
    return _float_at_least(name, 0.0, strict=True)


def _non_negative_float(name: str):
    return _float_at_least(name, 0.0, strict=False)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``hora`` command."""
    parser = argparse.ArgumentParser(prog="hora", description="Distributed deep-learning training launcher.")
    sub = parser.add_subparsers(dest="cmd", metavar="{run,check,timeline}")

    run = sub.add_parser("run", help="start N processes of a training command on this machine")
    run.add_argument("-np", "--num-proc", dest="np", type=_positive_int("-np"), required=True, help="number of ranks")
    run.add_argument("--mpi", action="store_true", help="run through mpiexec with the MPI backend")
    run.add_argument("--start-timeout", type=_positive_float("--start-timeout"), default=None,
                     help="seconds every rank has to reach rendezvous (default HORA_START_TIMEOUT or 60)")
    run.add_argument("--output-filename", metavar="DIR", default=None,
                     help="also write each rank's output to DIR/rank.<r>/stdout and stderr")
    run.add_argument("-H", "--hosts", default=None, metavar="HOST:SLOTS,...",
                     help="hosts and their slots; only this machine is supported for now")
    run.add_argument("--timeline-filename", default=None, metavar="FILE", help="write a Chrome-trace timeline")
    run.add_argument("--cycle-time-ms", type=_positive_float("--cycle-time-ms"), default=None)
    run.add_argument("--fusion-threshold-mb", type=_non_negative_float("--fusion-threshold-mb"), default=None)
    run.add_argument("--cache-capacity", type=int, default=None)
    run.add_argument("--autotune", action="store_true")
    run.add_argument("--no-shm", action="store_true",
                     help="ranks on one host allreduce through Gloo instead of shared memory (HORA_SHM_ALLREDUCE=0)")
    run.add_argument("--backend", default=None, choices=["auto", "gloo", "nccl", "mpi"],
                     help="collective backend (HORA_BACKEND); default auto")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the command to run (e.g. python train.py)")

    sub.add_parser("check", help="show which frameworks, backends, engines and stores are usable here")

    tl = sub.add_parser("timeline", help="work with timelines written by --timeline-filename")
    tl_sub = tl.add_subparsers(dest="timeline_cmd", metavar="{summarize}")
    summ = tl_sub.add_parser("summarize", help="time per phase of a timeline file")
    summ.add_argument("file")
    return parser


_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}


def _is_this_machine(host: str) -> bool:
    if host in _LOCAL_NAMES or host.startswith("127."):
        return True
    names = {socket.gethostname(), socket.getfqdn()}
    return host in names


def parse_hosts(spec: str) -> list[tuple[str, int]]:
    """Parse ``-H host:slots,host2:slots`` (slots default to 1).

    Raises:
        UsageError: malformed, or a host other than this machine.
    """
    out: list[tuple[str, int]] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, slots_s = item.rpartition(":")
        if not sep:
            host, slots_s = item, "1"
        if not host:
            raise UsageError(f"-H entry {item!r} has no host name")
        try:
            slots = int(slots_s)
        except ValueError:
            raise UsageError(f"-H entry {item!r}: slots must be an integer") from None
        if slots < 1:
            raise UsageError(f"-H entry {item!r}: slots must be >= 1")
        if not _is_this_machine(host):
            raise UsageError(
                f"-H names the remote host {host!r}: hora run only starts processes on this machine for now "
                "(use localhost, 127.0.0.1 or this machine's hostname)"
            )
        out.append((host, slots))
    if not out:
        raise UsageError("-H lists no hosts")
    return out


# --------------------------------------------------------------------------------------
# hora run
# --------------------------------------------------------------------------------------
class _Printer:
    """Writes prefixed rank output to the launcher's stdout/stderr, and the progress bar
    of the metrics ranks send with :func:`hora.runners.report`."""

    def __init__(self, run_id: str = "hora") -> None:
        from hora.runners.progress import Progress

        self.lock = threading.Lock()
        self.progress = Progress(run_id)
        self._metric_seq: dict[int, int] = {}

    def __call__(self, rank: int, stream: str, line: str) -> None:
        out: IO[str] = sys.stderr if stream == "stderr" else sys.stdout
        with self.lock:
            try:
                self.progress.write(f"[{rank}]<{stream}>:{line}", out)
            except (OSError, ValueError):
                pass

    def poll_metrics(self, server) -> None:
        """Render the latest metrics posted to the launcher's rendezvous server."""
        import pickle

        from hora.runners.spec import KEY_METRICS

        for key in server.keys(KEY_METRICS):
            try:
                rank = int(key[len(KEY_METRICS) :])
                seq, metrics = pickle.loads(server.wait([key], 0.01)[0])
            except Exception:
                continue
            if self._metric_seq.get(rank) != seq:
                self._metric_seq[rank] = seq
                with self.lock:
                    self.progress.update(rank, metrics)

    def close(self) -> None:
        with self.lock:
            self.progress.close()


def _settings_env(args: argparse.Namespace) -> dict[str, str]:
    from hora.runners.spec import native_settings_env

    if args.cache_capacity is not None and args.cache_capacity < 0:
        raise UsageError(f"--cache-capacity must be >= 0, got {args.cache_capacity}")
    try:
        return native_settings_env(
            timeline=args.timeline_filename,
            cycle_time_ms=args.cycle_time_ms,
            fusion_threshold_mb=args.fusion_threshold_mb,
            cache_capacity=args.cache_capacity,
            autotune=args.autotune,
            shm=not args.no_shm,
        )
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _validate_run(args: argparse.Namespace) -> list[str]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command given (e.g. hora run -np 2 python train.py)")
    if args.hosts is not None:
        hosts = parse_hosts(args.hosts)
        slots = sum(s for _, s in hosts)
        if slots < args.np:
            raise UsageError(f"-np {args.np} needs {args.np} slots but -H {args.hosts!r} offers {slots}")
    if shutil.which(command[0]) is None:
        raise UsageError(f"command not found: {command[0]!r} (not an executable file or on PATH)")
    if args.mpi and args.backend not in (None, "mpi"):
        raise UsageError(f"--mpi runs the MPI backend; it conflicts with --backend {args.backend}")
    return command


def _signal_name(code: int) -> str:
    from hora.runners.procs import describe_exit

    return describe_exit(code)


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        self.signum = signum


def _install_signal_handlers(flag: dict[str, int]) -> dict[int, object]:
    previous = {}

    def handler(signum, _frame):
        flag.setdefault("signum", signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, handler)
    return previous


def _restore_signal_handlers(previous: dict[int, object]) -> None:
    for sig, old in previous.items():
        signal.signal(sig, old)  # type: ignore[arg-type]


def _missing_at_start_barrier(server, np_: int, since: float, timeout: float, first_seen: dict[str, float]) -> tuple[str, list[int]] | None:
    """A start-up barrier some ranks reached but others not within ``timeout`` s of the first."""
    now = time.monotonic()
    arrived: dict[str, set[int]] = collections.defaultdict(set)
    for key in server.keys("barrier/"):
        name, _, rank_s = key[len("barrier/") :].rpartition("/")
        last = name.rsplit("/", 1)[-1].lower()
        if not name or not any(h in last for h in START_BARRIER_HINTS):
            continue
        try:
            arrived[name].add(int(rank_s))
        except ValueError:
            continue
    for name, ranks in arrived.items():
        first_seen.setdefault(name, now)
        missing = sorted(set(range(np_)) - ranks)
        if missing and now - max(since, first_seen[name]) > timeout:
            return name, missing
    return None


def run_command(args: argparse.Namespace) -> int:
    """``hora run``: returns the exit code."""
    from hora.native.rendezvous import (
        DEFAULT_START_TIMEOUT,
        ENV_START_TIMEOUT,
        RendezvousServer,
        WorkerEnv,
        compute_placement,
        env_float,
        make_secret,
    )
    from hora.runners.procs import ProcessLauncher, shell_exit_code
    from hora.runners.spec import ENV_DRIVER_ADDR, ENV_RUN_ID, new_run_id

    command = _validate_run(args)
    settings = _settings_env(args)
    try:
        start_timeout = args.start_timeout or env_float(ENV_START_TIMEOUT, DEFAULT_START_TIMEOUT)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    grace = 5.0
    output_dir = os.path.abspath(args.output_filename) if args.output_filename else None
    if output_dir:
        os.makedirs(output_dir, exist_ok=True)
    run_id = new_run_id()
    base_env = dict(os.environ)
    base_env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    base_env.setdefault("PYTHONUNBUFFERED", "1")
    base_env.update(settings)
    base_env[ENV_RUN_ID] = run_id
    if args.mpi:
        return _run_mpi(args, command, base_env, output_dir, start_timeout)

    secret = make_secret()
    server = RendezvousServer(secret, host="127.0.0.1", port=0)
    server.start()
    base_env[ENV_DRIVER_ADDR] = server.addr
    printer = _Printer(run_id)
    launcher = ProcessLauncher(printer, output_dir=output_dir)
    flag: dict[str, int] = {}
    previous = _install_signal_handlers(flag)
    started_at = time.monotonic()
    exit_order: list[int] = []
    try:
        for p in compute_placement(["127.0.0.1"] * args.np):
            env = dict(base_env)
            env.update(
                WorkerEnv(
                    rank=p.rank, size=args.np, local_rank=p.local_rank, local_size=p.local_size,
                    cross_rank=p.cross_rank, cross_size=p.cross_size, rendezvous_addr=server.addr,
                    secret=secret, job_id=run_id, hostname="127.0.0.1",
                    backend=args.backend or base_env.get("HORA_BACKEND", "auto") or "auto",
                    start_timeout=start_timeout,
                ).to_environ()
            )
            launcher.start(p.rank, command, env)
        first_seen: dict[str, float] = {}
        while True:
            if "signum" in flag:
                signum = flag["signum"]
                sys.stderr.write(f"hora run: received {signal.Signals(signum).name}; stopping all ranks\n")
                launcher.terminate(grace)
                return 128 + signum
            codes = launcher.poll()
            for rank, code in sorted(codes.items()):
                if code is not None and rank not in exit_order:
                    exit_order.append(rank)
            failed = [r for r in exit_order if codes[r] != 0]
            if failed:
                rank = failed[0]
                code = codes[rank]
                others = [r for r in launcher.alive() if r != rank]
                sys.stderr.write(
                    f"hora run: rank {rank} (pid {launcher.pid(rank)}) failed with {_signal_name(code)}"
                    + (f"; stopping rank(s) {others}\n" if others else "\n")
                )
                launcher.terminate(grace)
                launcher.wait_output(rank, 2.0)
                tb = launcher.traceback_of(rank)
                if tb:
                    sys.stderr.write(f"hora run: traceback of rank {rank}:\n{tb}\n")
                sys.stderr.flush()
                return shell_exit_code(code)
            if all(c == 0 for c in codes.values()):
                for r in codes:
                    launcher.wait_output(r, 5.0)
                return 0
            printer.poll_metrics(server)
            stuck = _missing_at_start_barrier(server, args.np, started_at, start_timeout, first_seen)
            if stuck is not None:
                name, missing = stuck
                sys.stderr.write(
                    f"hora run: rank(s) {missing} never arrived at rendezvous '{name}' within "
                    f"{start_timeout:g}s (--start-timeout); stopping all ranks\n"
                )
                launcher.terminate(grace)
                return 1
            time.sleep(POLL_INTERVAL)
    finally:
        launcher.terminate(grace)
        printer.close()
        _restore_signal_handlers(previous)
        server.stop()


# mpiexec (hydra) prepends its pattern to every *chunk* a rank writes, not to every line,
# so a line written in pieces arrives as "part one[1] part two". Marking chunks with
# ASCII separators that program output does not contain lets the launcher put each
# rank's pieces back together into whole lines.
_CHUNK_START, _CHUNK_RANK_END = "\x1e", "\x1f"


class _ChunkJoiner:
    """Reassembles per-rank lines from one mpiexec stream of marked chunks."""

    def __init__(self, emit: Callable[[int, str], None]) -> None:
        self._emit = emit
        self._rank = -1  # rank of the chunk being read; -1: mpiexec's own output
        self._partial: dict[int, str] = collections.defaultdict(str)

    def feed_line(self, line: str) -> None:
        """Take one newline-terminated line of the stream (without the newline)."""
        head, *chunks = line.split(_CHUNK_START)
        self._partial[self._rank] += head
        for chunk in chunks:
            rank, sep, text = chunk.partition(_CHUNK_RANK_END)
            if sep and rank.isdigit():
                self._rank = int(rank)
                self._partial[self._rank] += text
            else:  # not a marker after all: keep the text as it was
                self._partial[self._rank] += _CHUNK_START + chunk
        # the newline belongs to the chunk read last
        self._emit(self._rank, self._partial.pop(self._rank))


def _run_mpi(args: argparse.Namespace, command: list[str], base_env: dict[str, str], output_dir: str | None,
             start_timeout: float) -> int:
    from hora.runners.procs import ProcessLauncher, shell_exit_code

    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise UsageError("--mpi needs mpiexec on PATH (pip install mpich, or install an MPI)")
    printer = _Printer(str(base_env.get("HORA_RUN_ID", "hora")))
    tails: dict[int, collections.deque[str]] = collections.defaultdict(lambda: collections.deque(maxlen=400))
    files: dict[tuple[int, str], IO[str]] = {}
    lock = threading.Lock()

    def on_rank_line(stream: str, rank: int, text: str) -> None:
        printer(rank, stream, text)
        if rank < 0:
            return
        with lock:
            if stream == "stderr":
                tails[rank].append(text)
            if output_dir:
                fh = files.get((rank, stream))
                if fh is None:
                    os.makedirs(os.path.join(output_dir, f"rank.{rank}"), exist_ok=True)
                    fh = files[(rank, stream)] = open(os.path.join(output_dir, f"rank.{rank}", stream), "w")  # noqa: SIM115
                fh.write(text + "\n")
                fh.flush()

    joiners = {name: _ChunkJoiner(functools.partial(on_rank_line, name)) for name in ("stdout", "stderr")}

    def on_line(_launcher_rank: int, stream: str, line: str) -> None:
        joiners[stream].feed_line(line)

    env = dict(base_env)
    env["HORA_BACKEND"] = "mpi"
    env["PATH"] = os.path.dirname(mpiexec) + os.pathsep + env.get("PATH", "")
    argv = [mpiexec, "-n", str(args.np), "-prepend-pattern", f"{_CHUNK_START}%r{_CHUNK_RANK_END}", *command]
    launcher = ProcessLauncher(on_line)
    flag: dict[str, int] = {}
    previous = _install_signal_handlers(flag)
    try:
        launcher.start(0, argv, env)
        while True:
            if "signum" in flag:
                launcher.terminate(5.0)
                return 128 + flag["signum"]
            code = launcher.poll()[0]
            if code is not None:
                launcher.wait_output(0, 5.0)
                if code != 0:
                    sys.stderr.write(f"hora run: mpiexec exited with {_signal_name(code)}\n")
                    for rank, tail in sorted(tails.items()):
                        text = list(tail)
                        idx = [i for i, t in enumerate(text) if t.startswith("Traceback (most recent call last):")]
                        if idx:
                            sys.stderr.write(f"hora run: traceback of rank {rank}:\n" + "\n".join(text[idx[-1]:]) + "\n")
                return shell_exit_code(code)
            time.sleep(POLL_INTERVAL)
    finally:
        launcher.terminate(5.0)
        _restore_signal_handlers(previous)
        for fh in files.values():
            fh.close()


# --------------------------------------------------------------------------------------
# hora check
# --------------------------------------------------------------------------------------
def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_report() -> list[tuple[str, str, bool, str]]:
    """Rows ``(section, name, usable, detail)`` describing what is usable here."""
    rows: list[tuple[str, str, bool, str]] = []

    def add(section: str, name: str, ok: bool, detail: str) -> None:
        rows.append((section, name, ok, detail))

    # frameworks
    torch_v = _version("torch")
    add("frameworks", "torch", torch_v is not None and _importable("torch"), torch_v or "not installed")
    tf_v = _version("tensorflow") or _version("tensorflow-cpu") or _version("tensorflow_cpu")
    add("frameworks", "tensorflow", tf_v is not None and _importable("tensorflow"), tf_v or "not installed")
    keras_v = _version("keras")
    add("frameworks", "keras", keras_v is not None and _importable("keras"), keras_v or "not installed")
    light_v = _version("lightning") or _version("pytorch-lightning")
    add("frameworks", "lightning", light_v is not None, light_v or "not installed")

    # backends
    if torch_v is not None:
        try:
            import torch.distributed as dist

            add("backends", "gloo", bool(dist.is_available() and dist.is_gloo_available()), f"torch {torch_v}")
            import torch

            cuda = torch.cuda.is_available()
            n = torch.cuda.device_count() if cuda else 0
            nccl = bool(dist.is_available() and dist.is_nccl_available())
            add("backends", "nccl", nccl and n > 0,
                f"{n} CUDA device(s)" + ("" if nccl else ", torch built without NCCL"))
            from hora.native.backends.shm import availability

            add("backends", "shm", *availability())
        except Exception as exc:  # a broken torch install must not break `hora check`
            add("backends", "gloo", False, f"torch.distributed unusable: {exc}")
    else:
        add("backends", "gloo", False, "needs torch")
        add("backends", "nccl", False, "needs torch")
    mpi4py_v = _version("mpi4py")
    mpiexec = find_mpiexec()
    detail = f"mpi4py {mpi4py_v or 'not installed'}, mpiexec {mpiexec or 'not found'}"
    add("backends", "mpi", mpi4py_v is not None and mpiexec is not None, detail)

    # engines
    spark_v = _version("pyspark")
    java = shutil.which("java") or (os.environ.get("JAVA_HOME") and os.path.join(os.environ["JAVA_HOME"], "bin", "java"))
    add("engines", "pyspark", spark_v is not None, (spark_v or "not installed") + (f", java {java}" if spark_v else ""))
    dask_v, dist_v = _version("dask"), _version("distributed")
    add("engines", "dask/distributed", dask_v is not None and dist_v is not None,
        f"dask {dask_v or 'not installed'}, distributed {dist_v or 'not installed'}")

    # stores
    stores = [
        ("file", "fsspec", "fsspec"),
        ("memory", "fsspec", "fsspec"),
        ("s3", "s3fs", "s3fs"),
        ("gs", "gcsfs", "gcsfs"),
        ("hdfs", "pyarrow", "pyarrow"),
        ("abfs", "adlfs", "adlfs"),
        ("dbfs", "fsspec", "fsspec"),
    ]
    for scheme, dist, module in stores:
        v = _version(dist)
        ok = v is not None and _importable(module)
        add("stores", f"{scheme}://", ok, f"{dist} {v}" if v else f"needs {dist}")
    return rows


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
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hora`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.cmd == "run":
            return run_command(args)
        if args.cmd == "check":
            return check_command()
        if args.cmd == "timeline":
            return timeline_command(args)
        parser.print_help()
        return EXIT_USAGE
    except UsageError as exc:
        sys.stderr.write(f"hora {args.cmd}: error: {exc}\n")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
