"""The Dask launcher's view of the cluster's workers (``worker_infos``): asked of the scheduler at
each call, never the client's stored identity, which the client's periodic refresh replaces with
one listing no workers. That race made a run see its workers gone a second after it started
("Dask worker ... died or left the cluster"; seen once in a full run on a loaded machine)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(120)


def test_worker_infos_lists_every_worker_while_the_client_refreshes_its_identity(dask_client):
    import dask
    from distributed import Client

    from hora.runners.launchers.dask import DaskLauncher, worker_infos

    expected = set(dask_client.scheduler_info(n_workers=-1)["workers"])
    assert len(expected) == 2
    # the client's own refresh every millisecond instead of every 2 s: the race, made frequent
    with dask.config.set({"distributed.client.scheduler-info-interval": "1ms"}):
        client = Client(dask_client.scheduler.address, set_as_default=False)
    try:
        seen = [set(worker_infos(client)) for _ in range(300)]
        assert all(s == expected for s in seen), [s for s in seen if s != expected][:3]
        launcher = DaskLauncher(client=client)
        assert all({addr for addr, _ in launcher.pick_workers(2)} == expected for _ in range(100))
    finally:
        client.close()
