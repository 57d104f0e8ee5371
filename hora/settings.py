"""Every ``HORA_*`` environment setting, declared once, and the one function that reads them.

A :class:`Setting` has a name, a type, a default, bounds and a one-line doc; :func:`get`
reads one from the environment and checks it, raising :class:`~hora.errors.ConfigError`
that names the variable, the value and what it must be. ``hora check --env`` prints
every setting with its current value (:func:`describe`), and the README's table of
settings is generated from here (``python -m hora.settings --markdown``; a test keeps
the two equal).

Settings of the group ``contract`` are what a launcher gives each rank (its rank, the
rendezvous address, the job's secret): users normally never set them. This module
imports nothing heavy: ``import hora`` reads ``HORA_LOG_LEVEL`` through it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from hora.errors import ConfigError

#: the names that both the launchers (which set them for a run) and the engine (which
#: reads them) use; every other name has one home: its module's ``ENV_*`` constant
ENV_BACKEND = "HORA_BACKEND"
ENV_LOG_LEVEL = "HORA_LOG_LEVEL"
ENV_SHM_ALLREDUCE = "HORA_SHM_ALLREDUCE"
ENV_TIMELINE = "HORA_TIMELINE"
ENV_TIMELINE_MARK_CYCLES = "HORA_TIMELINE_MARK_CYCLES"
ENV_CYCLE_TIME = "HORA_CYCLE_TIME"
ENV_FUSION_THRESHOLD = "HORA_FUSION_THRESHOLD"
ENV_CACHE_CAPACITY = "HORA_CACHE_CAPACITY"
ENV_AUTOTUNE = "HORA_AUTOTUNE"

#: the collective backends ``HORA_BACKEND`` (``hora run --backend``, ``collective_backend=``) names
BACKENDS = ("auto", "gloo", "nccl", "mpi")
#: the log levels of ``HORA_LOG_LEVEL`` (Horovod's names)
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "WARN", "ERROR", "FATAL", "CRITICAL")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_KINDS = ("float", "int", "bool", "str", "choice")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One ``HORA_*`` variable.

    ``kind`` is float, int, bool, str or choice (one of ``choices``, matched without
    case). Numbers lie in ``[minimum, maximum]``; ``above`` makes the minimum exclusive
    (``> 0``). ``default`` None means "unset" (the code then decides, as the doc says).
    """

    name: str
    kind: str
    default: Any
    doc: str
    group: str
    minimum: float | None = None
    maximum: float | None = None
    above: bool = False
    choices: tuple[str, ...] = ()
    unit: str = ""
    secret: bool = False  # never printed (hora check --env shows only whether it is set)

    def __post_init__(self) -> None:
        if not self.name.startswith("HORA_"):
            raise ConfigError(f"setting {self.name!r}: every hora setting is named HORA_*")
        if self.kind not in _KINDS:
            raise ConfigError(f"setting {self.name}: kind {self.kind!r} is not one of {_KINDS}")
        if self.kind == "choice" and not self.choices:
            raise ConfigError(f"setting {self.name}: a choice needs choices")

    def bounds(self) -> str:
        """The allowed values in words ("> 0", "in [0, 65536]", "one of auto, gloo")."""
        if self.kind == "bool":
            return "1/0 (true/false, yes/no, on/off)"
        if self.kind == "choice":
            return "one of " + ", ".join(c.lower() if self.name != "HORA_LOG_LEVEL" else c for c in self.choices)
        if self.kind == "str":
            return "text"
        lo, hi = self.minimum, self.maximum
        what = "an integer" if self.kind == "int" else "a number"
        if lo is not None and hi is not None:
            return f"{what} in {'(' if self.above else '['}{_num(lo)}, {_num(hi)}]"
        if lo is not None:
            return f"{what} {'>' if self.above else '>='} {_num(lo)}"
        if hi is not None:
            return f"{what} <= {_num(hi)}"
        return what

    def parse(self, raw: str) -> Any:
        """The value of ``raw`` (the variable's text).

        Raises:
            ConfigError: not of the setting's type, or outside its bounds (the message
                names the variable, the value and the bounds).
        """
        text = raw.strip()
        if self.kind == "str":
            return raw
        if self.kind == "bool":
            low = text.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise self._error(raw)
        if self.kind == "choice":
            for c in self.choices:
                if c.lower() == text.lower():
                    return c
            raise self._error(raw)
        try:
            value: float | int = float(text)
        except ValueError:
            raise self._error(raw) from None
        if value != value or value in (float("inf"), float("-inf")):
            raise self._error(raw)
        if self.kind == "int":
            if not float(value).is_integer():
                raise self._error(raw)
            value = int(value)
        lo, hi = self.minimum, self.maximum
        if lo is not None and (value < lo or (self.above and value == lo)):
            raise self._error(raw)
        if hi is not None and value > hi:
            raise self._error(raw)
        return value

    def _error(self, raw: str) -> ConfigError:
        return ConfigError(f"{self.name}={raw!r} is invalid: it must be {self.bounds()}"
                           f"{' (' + self.unit + ')' if self.unit else ''}; {self.doc}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _s(name: str, kind: str, default: Any, doc: str, group: str, **kw: Any) -> Setting:
    return Setting(name, kind, default, doc, group, **kw)


_SECONDS = {"kind": "float", "minimum": 0.0, "above": True, "unit": "seconds"}

_DECLARED: tuple[Setting, ...] = (
    # -- what a launcher gives each rank (the rendezvous contract) ----------------------------
    _s("HORA_RANK", "int", None, "this process's rank in the job", "contract", minimum=0),
    _s("HORA_SIZE", "int", None, "the number of ranks in the job", "contract", minimum=1),
    _s("HORA_LOCAL_RANK", "int", None, "this rank's index among the ranks on its host (default: the rank)",
       "contract", minimum=0),
    _s("HORA_LOCAL_SIZE", "int", None, "the number of ranks on this host (default: the size)", "contract",
       minimum=1),
    _s("HORA_CROSS_RANK", "int", 0, "the index of this host among the hosts with this local rank", "contract",
       minimum=0),
    _s("HORA_CROSS_SIZE", "int", 1, "the number of hosts with this local rank", "contract", minimum=1),
    _s("HORA_RENDEZVOUS_ADDR", "str", None, "host:port of the job's rendezvous server", "contract"),
    _s("HORA_SECRET", "str", None, "hex of the job's secret: every frame between ranks is signed with it",
       "contract", secret=True),
    _s("HORA_TLS_CERT", "str", None, "the job's TLS certificate (base64 DER) its ranks pin: every connection to "
       "the driver service and the rendezvous server is TLS to exactly this certificate", "contract"),
    _s("HORA_JOB_ID", "str", "hora", "the job's id: the prefix of its keys on the rendezvous server", "contract"),
    _s("HORA_HOSTNAME", "str", "127.0.0.1", "the address this rank advertises to its peers (Gloo binds to it)",
       "contract"),
    _s("HORA_DRIVER_ADDR", "str", None, "host:port of the driver service (logs, metrics, failures)", "contract"),
    _s("HORA_RUN_ID", "str", None, "the run's id (names its folders and task keys)", "contract"),
    _s("HORA_SUPERVISOR_PID", "int", None, "pid of the process supervising this rank (the rank ends with it)",
       "contract", minimum=1),
    _s("HORA_ATTEMPT", "int", None, "the launch attempt this rank runs in (1, then 2, ... after relaunches)",
       "contract", minimum=0),
    _s("HORA_ELASTIC", "bool", False, "this rank is a worker of an elastic hora run", "contract"),
    _s("HORA_ELASTIC_WORKER", "str", None, "the elastic worker's name", "contract"),
    _s("HORA_ELASTIC_ROUND", "int", None, "the elastic membership round this worker is in", "contract", minimum=0),
    # -- launching ------------------------------------------------------------------------
    _s(ENV_BACKEND, "choice", "auto", "the collective backend (auto: MPI under mpiexec, else Gloo, plus "
       "NCCL for CUDA tensors when a GPU is there)", "launch", choices=BACKENDS),
    _s("HORA_START_TIMEOUT", default=60.0, doc="seconds for hosts to answer and every rank to meet at start",
       group="launch", **_SECONDS),
    _s("HORA_RENDEZVOUS_TIMEOUT", default=60.0, doc="seconds one wait on the rendezvous server may take",
       group="launch", **_SECONDS),
    _s("HORA_COLLECTIVE_TIMEOUT", default=300.0, doc="seconds a backend collective waits for its peers "
       "(Gloo, shared memory, MPI watchdog, NCCL)", group="launch", **_SECONDS),
    _s("HORA_ADVERTISE_ADDR", "str", None, "the address ranks advertise instead of the one the launcher "
       "found (real clusters)", "launch"),
    _s("HORA_DRIVER_CHANNEL", "choice", "auto", "how Spark ranks report to the client: auto (through the "
       "Store when a Connect client's executors cannot reach it), direct (TCP) or store", "launch",
       choices=("auto", "direct", "store")),
    _s("HORA_NETWORK_INTERFACE", "str", None, "ranks advertise this interface's address (Gloo and NCCL use it)",
       "launch"),
    _s("HORA_HEARTBEAT_TIMEOUT", default=30.0, doc="seconds without a heartbeat before a rank counts as dead",
       group="launch", **_SECONDS),
    _s("HORA_HOST_BEATS", "bool", True, "the ranks of a run on one host send their heartbeats (and metrics) through "
       "one of them, one frame per beat for the host (Linux; 0: every rank beats on its own)", "launch"),
    _s("HORA_FINISH_TIMEOUT", default=600.0, doc="seconds the other ranks get to return once one rank has",
       group="launch", **_SECONDS),
    _s("HORA_TERMINATE_GRACE", default=5.0, doc="seconds between SIGTERM and SIGKILL when ranks are stopped",
       group="launch", **_SECONDS),
    _s("HORA_ROOT_CAUSE_GRACE", default=10.0, doc="seconds to wait for a lost rank behind a survivor's error "
       "(so the failure names the root cause)", group="launch", **_SECONDS),
    _s("HORA_ELASTIC_TIMEOUT", default=600.0, doc="seconds an elastic worker waits for its next round "
       "(horovodrun's --elastic-timeout)", group="launch", **_SECONDS),
    _s("HORA_SSH_ARGS", "str", "", "extra ssh arguments (shell-quoted) for remote hosts, placed first",
       "launch"),
    _s("HORA_REMOTE_PYTHON", "str", None, "the Python on remote hosts (default: this interpreter's path)",
       "launch"),
    _s("HORA_WORKER_PYTHON", "str", None, "the interpreter Spark/Dask task supervisors start ranks with",
       "launch"),
    _s("HORA_TLS", "bool", False, "wrap every control channel that crosses hosts (the driver service, the "
       "rendezvous server) in TLS with a per-job certificate the ranks pin (needs hora[tls])", "launch"),
    _s("HORA_WARM_WORKERS", "bool", True, "Spark/Dask task supervisors fork ranks from a warm server that has "
       "imported torch (0: a fresh python per rank)", "launch"),
    _s("HORA_WARM_LOCAL", "bool", True, "local function ranks (hora.runners.run(backend='local'), hora.run, "
       "local estimator fits) fork from a warm server of the launching process that has imported torch "
       "(0: a fresh python per rank; HORA_WARM_WORKERS=0 turns every warm rank off)", "launch"),
    _s("HORA_WARM_COMMANDS", "bool", False, "hora run forks the ranks on this machine whose command is this "
       "interpreter (`python SCRIPT ARGS` or `python -m MODULE ARGS`) from a warm server that has imported "
       "HORA_WARM_PRELOAD; a rank that cannot be forked starts as a fresh process", "launch"),
    _s("HORA_WARM_IDLE_TIMEOUT", default=300.0, doc="seconds a warm rank server lives without a rank (it also "
       "ends with the process that started it; a Spark executor's server passes to the executor that replaces "
       "a lost one, for up to 60 s)", group="launch", **_SECONDS),
    _s("HORA_WARM_PRELOAD", "str", "torch,torch._dynamo,hora.native,hora.torch", "the modules a warm rank "
       "server imports before it forks ranks (comma list; none that starts a thread at import)", "launch"),
    _s("HORA_RAY_PLACEMENT_TIMEOUT", default=100.0, doc="seconds Ray gets to place the job's bundles",
       group="launch", **_SECONDS),
    _s("HORA_LOG_LEVEL", "choice", None, "hora's own log messages at this level and above go to stderr",
       "launch", choices=LOG_LEVELS),
    # -- the collective engine -------------------------------------------------------------
    _s(ENV_CYCLE_TIME, "float", 1.0, "milliseconds between negotiation rounds while work is pending "
       "(a burst of submissions is gathered for up to 10 cycles)", "engine", minimum=0.0, maximum=1000.0,
       unit="ms"),
    _s(ENV_FUSION_THRESHOLD, "int", 64 * 1024 * 1024, "bytes of allreduces fused into one collective "
       "(0: no fusion)", "engine", minimum=0, maximum=1 << 34, unit="bytes"),
    _s(ENV_CACHE_CAPACITY, "int", 1024, "response-cache slots: ops negotiated once, then by one bit per "
       "round (0: no cache)", "engine", minimum=0, maximum=1 << 16),
    _s("HORA_STALL_CHECK_TIME", "float", 60.0, "seconds before an op some ranks submitted and others did not "
       "is logged as a stall (0: no warnings)", "engine", minimum=0.0, unit="seconds"),
    _s("HORA_STALL_SHUTDOWN_TIME", "float", 0.0, "seconds before such a stalled op fails with a "
       "CollectiveError naming the ranks that never submitted it (0: never, as Horovod's default)",
       "engine", minimum=0.0, unit="seconds"),
    _s("HORA_OP_TIMEOUT", default=600.0, doc="seconds a synchronize() waits for its op", group="engine",
       **_SECONDS),
    _s("HORA_SHUTDOWN_TIMEOUT", default=30.0, doc="seconds shutdown waits for the other ranks to shut down",
       group="engine", **_SECONDS),
    _s("HORA_SPECULATE", "bool", True, "predicted rounds: a repeating round runs as one collective with its "
       "negotiation", "engine"),
    _s("HORA_LINGER_ROUNDS", "int", 0, "rounds without results the engine runs before going idle", "engine",
       minimum=0, maximum=1 << 20),
    _s(ENV_AUTOTUNE, "bool", False, "search fusion threshold and cycle time during the first steps",
       "engine"),
    _s("HORA_AUTOTUNE_WINDOW", "int", 20, "working rounds the autotuner scores each candidate over", "engine",
       minimum=1, maximum=1 << 20),
    _s(ENV_TIMELINE, "str", None, "write a Chrome trace of every op's phases to this file", "engine"),
    _s("HORA_TIMELINE_ALL_RANKS", "bool", False, "every rank writes a timeline (to <file>.rank<r>)", "engine"),
    _s(ENV_TIMELINE_MARK_CYCLES, "bool", False, "a marker per negotiation round in the timeline", "engine"),
    _s(ENV_SHM_ALLREDUCE, "bool", True, "ranks on one host allreduce through shared memory (else Gloo)",
       "engine"),
    _s("HORA_SHM_BUFFER_MB", "float", 8.0, "MiB of a shared-memory segment half (each rank maps 2 per group)",
       "engine", minimum=0.0, above=True, maximum=float(1 << 20), unit="MiB"),
    _s("HORA_SHM_SPIN_US", "int", 50, "microseconds a rank polls for its peers in a shared-memory step before "
       "it sleeps until they come (0: sleep at once)", "engine", minimum=0, maximum=1_000_000, unit="us"),
    _s("HORA_BUCKET_CAP_MB", "float", 25.0, "DistributedOptimizer's gradient bucket size (0: one op per "
       "gradient)", "engine", minimum=0.0, unit="MiB"),
    _s("HORA_RANK_THREADS", "int", 0, "torch threads of each CPU rank of an estimator, and OMP_NUM_THREADS of "
       "hora run's ranks on this machine (0: the rank's share of the host's cores, cores // ranks on the host, "
       "unless OMP_NUM_THREADS is set, as Dask, Ray and Spark set it)", "engine",
       minimum=0),
    _s("HORA_GPU_SHARING", "bool", False, "with use_gpu, let more ranks than GPUs share a host's GPUs (logged; "
       "NCCL refuses two ranks on one device) instead of failing", "engine"),
    _s("HORA_ELASTIC_RESET_LIMIT", "int", 5, "resets in a row without a commit before elastic training gives "
       "up (0: no limit)", "engine", minimum=0),
    # -- data and estimators ---------------------------------------------------------------
    _s("HORA_READER_TIMEOUT", default=600.0, doc="seconds a rank waits for one batch from its reader",
       group="data", **_SECONDS),
    _s("HORA_STORE_TIMEOUT", default=60.0, doc="seconds for a Store's reachability check", group="data",
       **_SECONDS),
    _s("HORA_STORE_RETRY_S", "float", 120.0, "seconds a Store operation retries transient failures (HTTP "
       "429/5xx, SlowDown, connection resets, timeouts) with backoff before it fails (0: no retries)", "data",
       minimum=0.0, unit="seconds"),
    _s("HORA_MATERIALIZE_LEASE_TTL", default=60.0, doc="seconds a materialization lease lives without a "
       "heartbeat", group="data", **_SECONDS),
    _s("HORA_MATERIALIZE_WAIT_TIMEOUT", "float", 3600.0, "seconds a fit waits for another writer's "
       "materialization of the same data (0: do not wait)", "data", minimum=0.0, unit="seconds"),
    _s("HORA_RAY_MATERIALIZE_TIMEOUT", default=600.0, doc="seconds without one Ray task of a materialization "
       "finishing before it fails", group="data", **_SECONDS),
    _s("HORA_TRANSFORM_INLINE_BYTES", "int", 16 << 20, "model bytes a Spark transform ships inside its "
       "function; larger models go once per session (broadcast, or a Connect artifact)", "data", minimum=0),
    _s("HORA_REPORT_EVERY", "int", None, "training steps between two progress reports (default: the "
       "estimator's)", "data", minimum=1),
)

SETTINGS: dict[str, Setting] = {s.name: s for s in _DECLARED}
if len(SETTINGS) != len(_DECLARED):  # pragma: no cover - a declaration error
    raise RuntimeError("a HORA_ setting is declared twice")
GROUPS = ("contract", "launch", "engine", "data")


def setting(name: str) -> Setting:
    """The declaration of ``name``.

    Raises:
        KeyError: ``name`` is not a declared setting (a bug in the caller).
    """
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError(f"{name} is not a declared hora setting (declare it in hora/settings.py)") from None


def default(name: str) -> Any:
    """The declared default of ``name``."""
    return setting(name).default


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of ``name`` in ``environ`` (default ``os.environ``), checked; its default
    when it is unset or empty.

    Raises:
        ConfigError: the value is not of the setting's type or lies outside its bounds.
        KeyError: ``name`` is not declared.
    """
    s = setting(name)
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None or (raw.strip() == "" and s.kind != "str"):
        return s.default
    return s.parse(raw)


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``name`` is set (to a non-empty value)."""
    setting(name)
    env = os.environ if environ is None else environ
    return bool(env.get(name))


def describe(environ: Mapping[str, str] | None = None, groups: Iterable[str] = GROUPS) -> list[tuple[str, str, str, str]]:
    """``(name, current value, default, doc)`` of every setting, for ``hora check --env``.

    A value that does not parse is shown with what it must be; secrets are shown as set
    or not, never their value.
    """
    env = os.environ if environ is None else environ
    wanted = set(groups)
    rows = []
    for s in _DECLARED:
        if s.group not in wanted:
            continue
        raw = env.get(s.name)
        if raw is None:
            current = "(unset)"
        elif s.secret:
            current = "(set, not shown)"
        else:
            try:
                s.parse(raw) if raw.strip() or s.kind == "str" else None
                current = raw
            except ConfigError:
                current = f"{raw!r} INVALID: must be {s.bounds()}"
        rows.append((s.name, current, _shown(s.default), s.doc))
    return rows


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return _num(value)
    if value == "":
        return '""'
    return str(value)


def markdown_table(groups: Iterable[str] = ("launch", "engine", "data")) -> str:
    """The README's table of user settings (generated: a test compares it with the README)."""
    lines = ["| variable | default | allowed | what it does |", "|---|---|---|---|"]
    wanted = set(groups)
    for s in _DECLARED:
        if s.group in wanted:
            unit = f" ({s.unit})" if s.unit else ""
            lines.append(f"| `{s.name}` | {_shown(s.default)} | {s.bounds()}{unit} | {s.doc} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m hora.settings [--markdown]``: print the settings (the README's table)."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--markdown"]:
        sys.stdout.write(markdown_table() + "\n")
        return 0
    for name, current, dflt, doc in describe():
        sys.stdout.write(f"{name:<44} {current:<24} default {dflt:<12} {doc}\n")
    return 0


__all__ = ["Setting", "SETTINGS", "BACKENDS", "LOG_LEVELS", "GROUPS", "get", "default", "setting", "is_set",
           "describe", "markdown_table"]

if __name__ == "__main__":
    raise SystemExit(main())
