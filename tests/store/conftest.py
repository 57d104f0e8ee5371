"""Fixtures of the store tests: a moto S3 server on 127.0.0.1 and ``any_store``, the same test over file://, memory:// and s3://."""

from __future__ import annotations

import os
import sys
import uuid

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# moto answers any credentials; keep boto from looking for real ones
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

S3_BUCKET = "hora-tests"


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3-protocol server (moto's standalone server) on a free port of 127.0.0.1."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    import s3fs

    fs = s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint})
    fs.mkdir(S3_BUCKET)
    yield endpoint
    server.stop()


@pytest.fixture(scope="session")
def s3_options(s3_endpoint):
    """Storage options that point s3fs at the moto server."""
    return {
        "key": "testing",
        "secret": "testing",
        "anon": False,
        "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
    }


def _make_store(kind: str, request, tmp_path):
    from hora.store import Store

    if kind == "file":
        return Store.create(f"file://{tmp_path}/store")
    if kind == "memory":
        return Store.create(f"memory://hora-test-{uuid.uuid4().hex[:8]}")
    if kind == "s3":
        options = request.getfixturevalue("s3_options")
        return Store.create(f"s3://{S3_BUCKET}/{uuid.uuid4().hex[:8]}", **options)
    raise AssertionError(kind)


@pytest.fixture(params=["file", "memory", "s3"])
def any_store(request, tmp_path):
    """A fresh, empty Store on each supported test scheme."""
    return _make_store(request.param, request, tmp_path)


@pytest.fixture
def file_store(tmp_path):
    from hora.store import Store

    return Store.create(str(tmp_path / "store"))


@pytest.fixture
def s3_store(request, tmp_path):
    return _make_store("s3", request, tmp_path)
