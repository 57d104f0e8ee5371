"""Real Spark processes for the tests and the benchmarks: a Spark Connect server and a Spark standalone cluster.

Both run the JVMs of the pip-installed pyspark (``SPARK_HOME`` = the pyspark package
folder), bind to loopback only, write their logs to files (shown when a start fails),
and stop every process they started: each daemon runs in its own process group, which
also holds the executors and Python workers it spawns, and the whole group is killed.

* :class:`ConnectServer`: ``spark-submit --class
  org.apache.spark.sql.connect.service.SparkConnectServer`` on a free port of 127.0.0.1
  (``--master local[2]`` by default, or a standalone master), event log on.
* :class:`StandaloneCluster`: ``spark-class org.apache.spark.deploy.master.Master`` and two
  ``...deploy.worker.Worker`` processes on 127.0.0.1 and 127.0.0.2 (two hosts as Spark and
  hora see them), each with 2 cores; every application gets one executor JVM per worker.

The pytest fixtures on them are in ``tests/spark_clusters.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

START_TIMEOUT = 240.0  # seconds; JVM start-up on a loaded 2-core machine
DAEMON_MEMORY = "512m"


def spark_home() -> str:
    """The pyspark package folder, which holds Spark's bin/, sbin/ and jars/."""
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _base_env(local_ip: str = "127.0.0.1") -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "SPARK_HOME": spark_home(),
        "SPARK_LOCAL_IP": local_ip,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_CONNECT_MODE": "0",  # the server itself is a classic application
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_NO_DAEMONIZE": "1",
    })
    for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "HORA_SECRET"):
        env.pop(name, None)
    return env


class SparkDaemon:
    """One JVM started in its own process group, its output in ``log_path``."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.log_path = cwd / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.cwd.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        finally:
            log.close()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_for(self, marker: str, timeout: float = START_TIMEOUT) -> None:
        """Wait until ``marker`` appears in the log; fail with the log's tail if the process
        exits or ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if marker in self.log_text():
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before {marker!r}:\n{self.log_tail()}")
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} did not log {marker!r} within {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the process group, then SIGKILL what is left of it."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # executors and Python workers of the group too
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self.proc = None


class ConnectServer:
    """A Spark Connect server on a free port of 127.0.0.1.

    Args:
        workdir: its working folder (logs, event log, warehouse).
        master: ``local[2]`` or a standalone master URL.
        conf: extra Spark settings (None removes a default one).
        memory: the driver JVM's heap.
    """

    def __init__(self, workdir: Path, master: str = "local[2]", conf: dict[str, str | None] | None = None,
                 memory: str = "640m") -> None:
        self.workdir = Path(workdir)
        self.master = master
        self.port = free_port()
        self.event_dir = self.workdir / "events"
        settings = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "2",
            "spark.python.worker.reuse": "true",
            "spark.pyspark.python": sys.executable,
            "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
            "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": "file://" + str(self.event_dir),
            "spark.eventLog.compress": "false",
            "spark.sql.warehouse.dir": "file://" + str(self.workdir / "warehouse"),
        }
        settings.update(conf or {})
        settings = {key: value for key, value in settings.items() if value is not None}
        argv = [
            os.path.join(spark_home(), "bin", "spark-submit"),
            "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name", "hora-tests-connect",
            "--master", master,
            "--driver-memory", memory,
        ]
        for key, value in settings.items():
            argv += ["--conf", f"{key}={value}"]
        self.daemon = SparkDaemon("connect-server", argv, _base_env(), self.workdir)

    @property
    def url(self) -> str:
        """The ``sc://`` URL clients connect to."""
        return f"sc://127.0.0.1:{self.port}"

    def start(self) -> ConnectServer:
        self.event_dir.mkdir(parents=True, exist_ok=True)
        self.daemon.start()
        self.daemon.wait_for("Spark Connect server started")
        return self

    def session(self, **conf: str):
        """A new Connect client session on this server (pyspark's process-wide Connect flag stays unset,
        so the classic session of the test run keeps working next to it)."""
        from pyspark.sql.connect.session import SparkSession

        builder = SparkSession.builder.remote(self.url)
        for key, value in conf.items():
            builder = builder.config(key, value)
        return builder.create()

    def event_log_text(self) -> str:
        """Everything the server's event log holds so far (what the Spark UI shows)."""
        text = ""
        for path in self.event_dir.rglob("*"):
            if path.is_file():
                text += path.read_text(errors="replace")
        return text

    def stop(self) -> None:
        self.daemon.stop()


class StandaloneCluster:
    """A Spark standalone master on 127.0.0.1 and two 2-core workers on 127.0.0.1 and 127.0.0.2."""

    def __init__(self, workdir: Path, worker_hosts: tuple[str, ...] = ("127.0.0.1", "127.0.0.2"), cores: int = 2,
                 memory: str = "1g") -> None:
        self.workdir = Path(workdir)
        self.port = free_port()
        self.worker_hosts = worker_hosts
        klass = os.path.join(spark_home(), "bin", "spark-class")
        self.master_daemon = SparkDaemon(
            "master",
            [klass, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
             "--webui-port", str(free_port())],
            _base_env(), self.workdir / "master",
        )
        self.workers = []
        for i, host in enumerate(worker_hosts):
            env = _base_env(local_ip=host)
            env["SPARK_WORKER_DIR"] = str(self.workdir / f"worker{i}" / "work")
            self.workers.append(SparkDaemon(
                f"worker{i}",
                [klass, "org.apache.spark.deploy.worker.Worker", "--host", host, "--webui-port", str(free_port(host)),
                 "--cores", str(cores), "--memory", memory, self.url],
                env, self.workdir / f"worker{i}",
            ))

    @property
    def url(self) -> str:
        """The master URL applications use."""
        return f"spark://127.0.0.1:{self.port}"

    def start(self) -> StandaloneCluster:
        self.master_daemon.start()
        self.master_daemon.wait_for("I have been elected leader")
        for worker in self.workers:
            worker.start()
        for worker in self.workers:
            worker.wait_for("Successfully registered with master")
        return self

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.master_daemon.stop()
