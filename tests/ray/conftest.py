"""One real local Ray cluster for every test in tests/ray: ``ray.init(num_cpus=2)``, no
dashboard, its session files in a temporary folder, started once and shut down when the
last test of this package is done (package scope: at the end of the whole session, other
packages' session fixtures, e.g. the Dask cluster, would hold processes of their own);
the teardown fails when a process of the cluster outlives ``ray.shutdown()``."""

from __future__ import annotations

import time

import pytest


def _ray_children() -> list:
    import psutil

    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.fixture(scope="package")
def ray_cluster():
    """The ``ray`` module, connected to a fresh 2-CPU local cluster."""
    ray = pytest.importorskip("ray", reason="the Ray tests need the hora[ray] extra (pip install 'hora[ray]')")
    import logging
    import shutil
    import tempfile

    before = {p.pid for p in _ray_children()}
    temp_dir = tempfile.mkdtemp(prefix="hora-ray-")  # short: Ray's socket paths live below it
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, configure_logging=False,
             _temp_dir=temp_dir)
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        deadline = time.monotonic() + 30
        while True:
            left = [p for p in _ray_children() if p.pid not in before]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert not left, f"Ray processes left after ray.shutdown(): {[(p.pid, p.name()) for p in left]}"


@pytest.fixture
def free_cluster(ray_cluster):
    """The cluster, checked to have all its CPUs free again after the test (placement groups removed)."""
    yield ray_cluster
    deadline = time.monotonic() + 30
    while ray_cluster.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray_cluster.available_resources().get("CPU", 0) == 2, (
        f"resources still held after the test: {ray_cluster.available_resources()}")
