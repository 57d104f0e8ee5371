"""pytest fixtures on real Spark processes: a Spark Connect server and a Spark standalone cluster.

The processes themselves (:class:`ConnectServer`, :class:`StandaloneCluster`) are the harness the
benchmarks share, in ``benchmarks/_common/spark.py``. The fixtures are registered by ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import os
import sys

import pytest

from benchmarks._common.spark import ConnectServer, StandaloneCluster


# ------------------------------------------------------------------------------------------
# fixtures (registered by tests/conftest.py)
# ------------------------------------------------------------------------------------------
def _need_connect_client() -> None:
    for module in ("grpc", "grpc_status", "google.rpc", "zstandard"):
        pytest.importorskip(module, reason="the Spark Connect client needs pip install 'hora[spark]'")


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory):
    """A Spark Connect server (local[2]) for the whole test run."""
    _need_connect_client()
    server = ConnectServer(tmp_path_factory.mktemp("connect-server"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def connect_spark(connect_server):
    """A Spark Connect client session on :func:`connect_server`."""
    session = connect_server.session()
    yield session
    with contextlib.suppress(Exception):
        session.stop()


@pytest.fixture(params=["classic", "connect"])
def any_spark(request):
    """The classic ``spark`` session and the Connect ``connect_spark`` session, in turn."""
    return request.getfixturevalue("spark" if request.param == "classic" else "connect_spark")


def python_without_hora(tmp_path) -> str:
    """An interpreter for Spark's Python workers that cannot import hora (as on a cluster without it)."""
    shadow = tmp_path / "shadow" / "hora"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'hora'\", name='hora')\n")
    python = tmp_path / "python-without-hora"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={shadow.parent}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return str(python)


CONNECT_FLAG = "SPARK_CONNECT_MODE_ENABLED"


@contextlib.contextmanager
def connect_mode(session):
    """While the block runs, this process looks to pyspark as a Connect-only process does, if ``session`` is Connect.

    ``SparkSession.builder.remote(url).getOrCreate()`` sets pyspark's process-wide flag
    ``SPARK_CONNECT_MODE_ENABLED``, and ``pyspark.ml`` (VectorAssembler, evaluators, the
    Pipeline and CrossValidator writers), ``pyspark.sql.functions`` and
    ``SparkSession.active()`` read it at every call to pick Connect or classic. The test
    process also holds the classic session, so the flag is set only inside the block, with
    ``session`` as the active Connect session: exactly the state of a user's Connect-only
    process. For a classic ``session`` the block runs as it is.
    """
    from hora import _spark

    if not _spark.is_connect(session):
        yield session
        return
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    saved_flag = os.environ.get(CONNECT_FLAG)
    saved_active = getattr(ConnectSession._active_session, "session", None)
    os.environ[CONNECT_FLAG] = "1"
    ConnectSession._active_session.session = session
    try:
        yield session
    finally:
        ConnectSession._active_session.session = saved_active
        if saved_flag is None:
            os.environ.pop(CONNECT_FLAG, None)
        else:
            os.environ[CONNECT_FLAG] = saved_flag


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory):
    """A Spark standalone cluster: a master and two 2-core workers (127.0.0.1, 127.0.0.2)."""
    cluster = StandaloneCluster(tmp_path_factory.mktemp("standalone"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def standalone_connect(standalone_cluster, tmp_path_factory):
    """A Spark Connect server whose master is :func:`standalone_cluster`, and a client session on it."""
    _need_connect_client()
    server = ConnectServer(
        tmp_path_factory.mktemp("standalone-connect"), master=standalone_cluster.url,
        # no spark.default.parallelism: hora finds the cluster's (4 cores) with one tiny job
        conf={"spark.executor.memory": "512m", "spark.default.parallelism": None},
    )
    try:
        server.start()
        session = server.session()
        yield server, session
        with contextlib.suppress(Exception):
            session.stop()
    finally:
        server.stop()
