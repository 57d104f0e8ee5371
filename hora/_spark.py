"""What hora asks of a SparkSession, answered the same way on classic and Spark Connect sessions.

A Spark Connect client (``SparkSession.builder.remote("sc://...")``) has no SparkContext
and no JVM: everything must go through the DataFrame and session APIs. The launcher
(:mod:`hora.runners.launchers.spark`) and the store's Spark writer (:mod:`hora.store.spark_source`)
share these helpers so that their code has one path for both kinds of session:

* :func:`is_connect` tells the two apart by the object's class, never by pyspark's
  process-wide ``is_remote()`` flag (a process may hold a classic session and a Connect
  client at once; the flag then describes neither).
* :func:`conf_get` reads the session's configuration (``spark.conf``; on Connect the
  server's).
* :func:`job_scope` / :func:`cancel_jobs` tag and label the jobs a block starts and
  cancel them by tag. Classic: SparkContext job tags (``addJobTag`` /
  ``cancelJobsWithTag``) and the job description; ``SparkSession.interruptTag`` is no
  use there, since classic Spark scopes a session tag to the thread that added it
  (the real tag carries a thread UUID), so another thread cannot cancel by it.
  Connect: session tags (``addTag`` / ``interruptTag``); the server sets the job
  description itself (``Spark Connect - <request>``) and offers the client no way to
  change it.
* :func:`functions` / :func:`vector_to_array` pick the column-function module that
  matches the DataFrame.
* :func:`task_profile` builds a task ``ResourceProfile`` for ``mapInArrow(profile=)``.
* :func:`overwrite_path` clears an ML ``save(path)`` target where the Spark driver sees it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from hora.errors import ConfigError

log = logging.getLogger(__name__)

#: The oldest Spark Connect server whose ``mapInArrow`` takes ``barrier=`` and ``profile=``.
MIN_CONNECT_SERVER = (4, 0)
#: Seconds a tiny probe job of hora's may wait for free executors.
PROBE_TIMEOUT = 300.0


def is_connect(obj: Any) -> bool:
    """True for a Spark Connect session or DataFrame (the client-side classes)."""
    return type(obj).__module__.startswith("pyspark.sql.connect")


def session_key(session: Any) -> str:
    """A key naming one session in this process (a Connect session's id; a classic session's object id)."""
    return str(getattr(session, "session_id", None) or id(session))


def active_session(spark: Any = None) -> Any:
    """``spark`` itself, else the active classic session, else the active Connect session.

    Raises:
        ConfigError: none is given and none is active.
    """
    if spark is not None:
        return spark
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is None and "pyspark.sql.connect.session" in sys.modules:
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        session = ConnectSession.getActiveSession()
    if session is None:
        raise ConfigError(
            "backend='spark' needs a SparkSession: start one (classic, or Spark Connect with "
            "SparkSession.builder.remote('sc://host:port')) or pass spark="
        )
    return session


def conf_get(session: Any, key: str, default: str | None = None) -> str | None:
    """A configuration value of the session (on Connect: the server's), or ``default``."""
    try:
        value = session.conf.get(key, default)
    except Exception:  # unknown keys raise on some versions instead of returning the default
        return default
    return default if value is None else str(value)


def master(session: Any) -> str:
    """The cluster manager URL (``local[2]``, ``spark://host:7077``, ``yarn``, ...)."""
    if not is_connect(session):
        return str(session.sparkContext.master)
    return conf_get(session, "spark.master", "") or ""


def missing_hora(exc: BaseException) -> ConfigError | None:
    """A clear error when a failed Spark job says its Python workers cannot import hora, else None."""
    match = re.search(r"(ModuleNotFoundError: No module named '(?:hora|cloudpickle)[^']*')", str(exc))
    if match is None:
        return None
    return ConfigError(
        f"the Spark executors cannot import hora ({match.group(1)}): install hora in the Python the executors "
        "run (spark.pyspark.python / PYSPARK_PYTHON on the cluster, or spark.sql.execution.pyspark.python for "
        "a session)"
    )


def check_connect_server(session: Any) -> None:
    """Fail at once when a Connect server is too old for hora's barrier stage.

    Raises:
        ConfigError: a Connect server older than 4.0 (its ``mapInArrow`` ignores
            ``barrier=True`` and ``profile=``).
    """
    if not is_connect(session):
        return
    version = str(session.version)
    try:
        major_minor = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        log.debug("cannot parse the Spark Connect server version %r", version)
        return
    if major_minor < MIN_CONNECT_SERVER:
        raise ConfigError(
            f"the Spark Connect server runs Spark {version}; hora launches its ranks as a barrier "
            f"mapInArrow stage, which Spark Connect supports from Spark "
            f"{'.'.join(map(str, MIN_CONNECT_SERVER))} on: upgrade the server or use a classic session"
        )


def default_parallelism(session: Any) -> int:
    """Spark's default parallelism (what ``spark.range(n)`` splits into).

    Classic: ``sparkContext.defaultParallelism``. Connect: ``spark.default.parallelism``
    when set, else the partition count of a ``spark.range`` (one tiny job).
    """
    if not is_connect(session):
        return int(session.sparkContext.defaultParallelism)
    configured = conf_get(session, "spark.default.parallelism")
    if configured:
        return int(configured)
    frame = session.range(0, 1 << 16).mapInArrow(_one_row_per_partition, "n long")
    rows = collect(session, frame, f"hora-parallelism-{uuid.uuid4().hex[:8]}", "hora: count the default parallelism",
                   timeout=PROBE_TIMEOUT)
    return max(1, len(rows))


def _one_row_per_partition(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    n = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"n": pa.array([n], pa.int64())})


def num_partitions(df: Any) -> int | None:
    """The partition count of a DataFrame, or None where the API cannot tell without a job (Connect)."""
    if is_connect(df):
        return None
    return int(df.rdd.getNumPartitions())


@contextlib.contextmanager
def job_scope(session: Any, tag: str, description: str) -> Iterator[None]:
    """Tag (and on classic, describe) every Spark job this thread starts inside the block.

    The tag lets :func:`cancel_jobs` stop them from any thread. Tags must not contain commas.
    """
    if is_connect(session):
        session.addTag(tag)
        try:
            yield
        finally:
            session.removeTag(tag)
        return
    sc = session.sparkContext
    sc.addJobTag(tag)
    sc.setJobDescription(description)
    try:
        yield
    finally:
        sc.removeJobTag(tag)
        sc.setJobDescription(None)  # type: ignore[arg-type]


_PAUSE_LOCK = threading.Lock()
#: ``lastFinishTime`` while paused: far in the future, so ``now - lastFinishTime`` stays below the bar's delay.
_FAR_FUTURE_MS = 2**62
#: How often a pause re-arms itself: under the bar's 500 ms first delay, which follows each job's end.
_REARM_S = 0.2


class _BarPause:
    """The open pauses of one SparkContext's console bar, and the thread that keeps the bar quiet."""

    def __init__(self, session: Any, bar: Any, fld: Any) -> None:
        self.session, self.bar, self.fld = session, bar, fld
        self.count = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._keep, name="hora-spark-bar-pause", daemon=True)

    def _keep(self) -> None:
        # Spark ends every job with finishAll(), which sets lastFinishTime to now: a block that
        # runs several jobs would see the bar again 500 ms after the first one ends.
        while not self.stop.wait(_REARM_S):
            try:
                self.fld.setLong(self.bar, _FAR_FUTURE_MS)
            except Exception as exc:  # the context is stopping
                log.debug("stopped pausing Spark's console progress bar: %s", exc)
                return

    def open(self) -> None:
        self.bar.finishAll()  # clears a bar on screen
        self.fld.setLong(self.bar, _FAR_FUTURE_MS)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.fld.setLong(self.bar, self.session.sparkContext._jvm.System.currentTimeMillis())


_PAUSES: dict[int, _BarPause] = {}  # id(SparkContext) -> its open pauses


def _console_progress_bar(session: Any) -> tuple[Any, Any] | None:
    """The classic session's ``ConsoleProgressBar`` and its ``lastFinishTime`` field, or None.

    None on Spark Connect (the server's console is not the user's), when the bar is off
    (``spark.ui.showConsoleProgress=false``) or when this Spark's bar has no such field.
    """
    if is_connect(session):
        return None
    option = session.sparkContext._jsc.sc().progressBar()
    if not option.isDefined():
        return None
    bar = option.get()
    for fld in bar.getClass().getDeclaredFields():
        if fld.getName() == "lastFinishTime" or fld.getName().endswith("$$lastFinishTime"):
            fld.setAccessible(True)
            return bar, fld
    return None


@contextlib.contextmanager
def console_progress_paused(session: Any) -> Iterator[None]:
    """Keep Spark's own console progress bar (``[Stage N:>  (0 + 2) / 2]``) quiet inside the block.

    hora's training stage prints its own progress (one bar or line per epoch); Spark's bar
    for the same stage would interleave with it. Spark has no API to pause its bar
    (``spark.ui.showConsoleProgress`` is read once, when the SparkContext starts), but the
    bar draws nothing while ``now - lastFinishTime`` is under its first delay: the block
    clears a bar on screen (``finishAll``), keeps that field far in the future (re-armed
    every 0.2 s, since each job's end resets it), and on exit sets it to now, as the end
    of a job does. Nested and concurrent blocks on one context pause once and restore
    when the last ends. On Spark Connect, with the bar off, or where this Spark's bar
    differs (the reflection fails), it does nothing but log at DEBUG: a fit never
    depends on it.
    """
    key = id(session.sparkContext) if not is_connect(session) else None
    with _PAUSE_LOCK:
        pause = _PAUSES.get(key) if key is not None else None
        if pause is None and key is not None:
            try:
                found = _console_progress_bar(session)
                if found is not None:
                    pause = _BarPause(session, *found)
                    pause.open()
                    _PAUSES[key] = pause
            except Exception as exc:  # py4j / reflection: a different Spark build
                log.debug("cannot pause Spark's console progress bar: %s", exc)
                pause = None
        if pause is not None:
            pause.count += 1
    try:
        yield
    finally:
        if pause is not None:
            with _PAUSE_LOCK:
                pause.count -= 1
                if pause.count == 0:
                    del _PAUSES[key]
                    try:
                        pause.close()
                    except Exception as exc:  # the context may be stopping
                        log.debug("cannot restore Spark's console progress bar: %s", exc)


def collect(session: Any, frame: Any, tag: str, description: str, timeout: float) -> list[Any]:
    """``frame.collect()`` inside :func:`job_scope`, given up (and its jobs cancelled) after ``timeout`` s.

    Raises:
        TimeoutError: the jobs did not finish in time (e.g. no executor was free to run them).
        Exception: whatever the job raised.
    """
    outcome: dict[str, Any] = {}

    def _run() -> None:
        try:
            with job_scope(session, tag, description):
                outcome["rows"] = frame.collect()
        except BaseException as exc:  # handed to the caller
            outcome["error"] = exc

    thread = threading.Thread(target=_run, name=f"hora-{tag}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        cancel_jobs(session, tag)
        thread.join(30)
        raise TimeoutError(f"the Spark job {description!r} did not finish within {timeout:.0f} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["rows"]


def cancel_jobs(session: Any, tag: str) -> None:
    """Cancel (and interrupt the tasks of) every running job tagged ``tag`` by :func:`job_scope`."""
    if is_connect(session):
        session.interruptTag(tag)
    else:
        session.sparkContext.cancelJobsWithTag(tag)


def functions(df: Any) -> Any:
    """``pyspark.sql.functions`` for the kind of session ``df`` belongs to."""
    if is_connect(df):
        from pyspark.sql.connect import functions as F
    else:
        from pyspark.sql import functions as F
    return F


def vector_to_array(df: Any, column: Any, dtype: str) -> Any:
    """``vector_to_array(column, dtype)`` built for the kind of session ``df`` belongs to."""
    if is_connect(df):
        from pyspark.ml.connect.functions import vector_to_array as to_array
    else:
        from pyspark.ml.functions import vector_to_array as to_array
    return to_array(column, dtype=dtype)


def task_profile(session: Any, cpus: int, gpus: int = 0) -> Any:
    """A task-only ``ResourceProfile`` (``cpus`` per task, ``gpus`` GPUs per task) for ``mapInArrow(profile=)``.

    Spark schedules it on the executors of the default profile (a TaskResourceProfile:
    Standalone, YARN and Kubernetes with dynamic allocation off, which barrier stages need).
    """
    if is_connect(session):
        import pyspark.sql.connect.proto as pb2
        from pyspark.resource import ResourceProfile, TaskResourceRequest

        requests = {"cpus": TaskResourceRequest("cpus", float(cpus))}
        if gpus:
            requests["gpu"] = TaskResourceRequest("gpu", float(gpus))
        profile = ResourceProfile(_exec_req={}, _task_req=requests)
        remote = pb2.ResourceProfile(
            task_resources={
                name: pb2.TaskResourceRequest(resource_name=name, amount=req.amount) for name, req in requests.items()
            }
        )
        # registered on this session's server (pyspark's own path asks the process-wide active session)
        profile._id = session.client._create_profile(remote)
        return profile
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    requests_ = TaskResourceRequests().cpus(int(cpus))
    if gpus:
        requests_ = requests_.resource("gpu", float(gpus))
    return ResourceProfileBuilder().require(requests_).build


def overwrite_path(session: Any, path: str) -> None:
    """Delete ``path`` (as the Spark driver sees it) before an ML ``save`` that overwrites it.

    Classic: MLlib's JVM helper (``FileSystemOverwrite``). Connect: the same helper on the
    server, through the ML command Spark Connect's own writers send (``handleOverwrite``),
    on this session rather than the process-wide active one.
    """
    if not is_connect(session):
        from pyspark.ml.wrapper import JavaWrapper

        helper = JavaWrapper(JavaWrapper._new_java_obj("org.apache.spark.ml.util.FileSystemOverwrite"))
        helper._call_java("handleOverwrite", path, True, session._jsparkSession)
        return
    import pyspark.sql.connect.proto as pb2
    from pyspark.ml.connect.serialize import serialize
    from pyspark.ml.util import ML_CONNECT_HELPER_ID

    command = pb2.Command()
    command.ml_command.fetch.CopyFrom(pb2.Fetch(
        obj_ref=pb2.ObjectRef(id=ML_CONNECT_HELPER_ID),
        methods=[pb2.Fetch.Method(method="handleOverwrite", args=serialize(session.client, path, True))],
    ))
    session.client.execute_command(command)


def connect_server_host(session: Any) -> str | None:
    """The host name of a Connect session's server (None for classic sessions or when unknown)."""
    if not is_connect(session):
        return None
    builder = getattr(getattr(session, "client", None), "_builder", None)
    host = getattr(builder, "host", None)
    return str(host).strip("[]") if host else None


def address_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (no packet is sent); loopback for loopback hosts."""
    try:
        infos = socket.getaddrinfo(host, 15002, socket.AF_INET, socket.SOCK_DGRAM)
        target = infos[0][4][0]
    except OSError:
        return "127.0.0.1"
    if target.startswith("127."):
        return "127.0.0.1"
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) as sock:
        try:
            sock.connect((target, 15002))
            return str(sock.getsockname()[0])
        except OSError:
            return "127.0.0.1"


__all__ = [
    "is_connect",
    "active_session",
    "conf_get",
    "master",
    "check_connect_server",
    "default_parallelism",
    "num_partitions",
    "job_scope",
    "collect",
    "cancel_jobs",
    "session_key",
    "functions",
    "vector_to_array",
    "task_profile",
    "overwrite_path",
    "connect_server_host",
    "address_towards",
]
