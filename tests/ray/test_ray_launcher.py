"""hora.runners.run(..., backend="ray") against the real local Ray cluster of conftest.py."""

from __future__ import annotations

import io
import os

import pytest

import hora.runners
from hora.errors import ConfigError, RankError, RendezvousError, WorkerFailedError, WorkerLostError


def _allreduce_and_place(scale):
    import numpy as np

    import hora.native as hn

    print(f"rank {hn.rank()} says hello")
    total = hn.allreduce(np.array([scale * (hn.rank() + 1)] * 3), op=hn.Sum, name="ray.sum")
    return {"rank": hn.rank(), "size": hn.size(), "local_rank": hn.local_rank(), "local_size": hn.local_size(),
            "cross_rank": hn.cross_rank(), "cross_size": hn.cross_size(), "sum": total.tolist(),
            "host": os.environ["HORA_HOSTNAME"], "pid": os.getpid()}


@pytest.mark.timeout(180)
def test_two_ranks_allreduce_placement_and_output(free_cluster):
    out = io.StringIO()
    results = hora.runners.run(_allreduce_and_place, args=(2.0,), num_proc=2, backend="ray", stdout=out)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 and r["sum"] == [6.0, 6.0, 6.0] for r in results)
    # one node: ranks 0 and 1 are local ranks 0 and 1 of one host (shared memory), cross_size 1
    assert [(r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"]) for r in results] == [
        (0, 2, 0, 1), (1, 2, 0, 1)]
    assert {r["host"] for r in results} == {"127.0.0.1"}
    assert len({r["pid"] for r in results} | {os.getpid()}) == 3  # two actor processes, not the driver
    text = out.getvalue()
    assert "[0]<stdout>:rank 0 says hello" in text and "[1]<stdout>:rank 1 says hello" in text


def _raise_on_rank_one():
    import hora.native as hn

    if hn.rank() == 1:
        raise ValueError("rank one refuses")
    return hn.rank()


@pytest.mark.timeout(180)
def test_raising_rank_is_reported_with_its_traceback(free_cluster):
    with pytest.raises(WorkerFailedError) as info:
        hora.runners.run(_raise_on_rank_one, num_proc=2, backend=hora.runners.RayLauncher(strategy="SPREAD"),
                         verbose=0)
    err = info.value
    assert type(err) is RankError
    assert err.rank == 1 and err.host == "127.0.0.1"
    assert "ValueError: rank one refuses" in str(err)
    assert "_raise_on_rank_one" in (err.remote_traceback or "")


def _rank_one_dies(marker_dir, how):
    import signal
    import time

    import numpy as np

    import hora.native as hn

    hn.allreduce(np.array([1.0]), op=hn.Sum, name="first")
    open(os.path.join(marker_dir, f"in.{hn.rank()}"), "w").close()
    if hn.rank() == 1:
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)  # ray.kill by the test
    # rank 0 waits outside any collective: a peer blocked in one would also fail (with the lost peer
    # named), and which of the two the driver hears of first is a race the monitor does not settle
    time.sleep(120)


def _kill_when_inside(launcher, marker_dir):
    """ray.kill rank 1's actor once both ranks are inside fn."""
    import threading
    import time

    import ray

    def kill():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if all(os.path.exists(os.path.join(marker_dir, f"in.{r}")) for r in (0, 1)):
                ray.kill(launcher.last_job.group.actors[1])
                return
            time.sleep(0.1)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["sigkill", "ray.kill"])
def test_killed_actor_is_reported_lost_and_the_other_rank_stopped(free_cluster, tmp_path, how):
    launcher = hora.runners.RayLauncher()
    killer = _kill_when_inside(launcher, str(tmp_path)) if how == "ray.kill" else None
    with pytest.raises(WorkerFailedError) as info:
        hora.runners.run(_rank_one_dies, args=(str(tmp_path), how), num_proc=2, backend=launcher, verbose=0)
    err = info.value
    assert type(err) is WorkerLostError and err.retriable
    assert err.rank == 1 and err.host == "127.0.0.1"
    assert "was lost: its Ray actor" in err.message and "died" in err.message, err.message
    if killer is not None:
        killer.join(timeout=5)
    # free_cluster checks that both actors are gone and the placement group removed


@pytest.mark.timeout(120)
def test_placement_that_cannot_fit_or_be_scheduled(free_cluster):
    ray = free_cluster
    with pytest.raises(ConfigError, match=r"num_proc=3 .*'CPU': 2\.0"):
        hora.runners.run(_raise_on_rank_one, num_proc=3, backend="ray")
    with pytest.raises(ConfigError, match=r"GPU"):
        hora.runners.run(_raise_on_rank_one, num_proc=1, backend=hora.runners.RayLauncher(gpus_per_rank=1))
    with pytest.raises(ConfigError, match="strategy 'near' is unknown"):
        hora.runners.RayLauncher(strategy="near")
    # the cluster could hold the rank, but another placement group holds every CPU: a clear timeout
    from ray.util.placement_group import placement_group, remove_placement_group

    holder = placement_group([{"CPU": 2}])
    ray.get(holder.ready(), timeout=60)
    try:
        with pytest.raises(RendezvousError) as info:
            hora.runners.run(_raise_on_rank_one, num_proc=1,
                             backend=hora.runners.RayLauncher(cpus_per_rank=1, placement_timeout=2))
        text = str(info.value)
        assert "not scheduled within 2s" in text
        assert "{'CPU': 0.0} available of {'CPU': 2.0} in total" in text
    finally:
        remove_placement_group(holder)
