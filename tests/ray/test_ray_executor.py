"""hora.ray.RayExecutor (Horovod's horovod.ray API) against the real local Ray cluster."""

from __future__ import annotations

import pytest

from hora.errors import ConfigError, RankError, WorkerFailedError


class _Trainer:
    """An executable: built in every worker inside a hora run, kept between calls."""

    def __init__(self, base):
        import hora.torch as hvd

        hvd.init()
        self.base = base
        self.built_on_rank = hvd.rank()
        self.calls = 0

    def step(self):
        import torch

        import hora.torch as hvd

        self.calls += 1
        total = hvd.allreduce(torch.tensor([float(self.base + hvd.rank())]), op=hvd.Sum, name=f"step{self.calls}")
        return (hvd.rank(), self.built_on_rank, self.calls, float(total[0]))


def _rank_and_sum(x):
    import torch

    import hora.torch as hvd

    hvd.init()
    return hvd.rank(), float(hvd.allreduce(torch.tensor([x]), op=hvd.Sum, name="run")[0])


def _fail_on_zero():
    import hora.torch as hvd

    hvd.init()
    if hvd.rank() == 0:
        raise KeyError("rank zero's bad key")
    return hvd.rank()


@pytest.mark.timeout(240)
def test_executor_start_run_execute_remote_single_shutdown(free_cluster):
    from hora.ray import RayExecutor

    ray = free_cluster
    settings = RayExecutor.create_settings(timeout_s=120)
    executor = RayExecutor(settings, num_workers=2, cpus_per_worker=1, use_gpu=False)
    executor.start(executable_cls=_Trainer, executable_args=[10])
    try:
        assert executor.num_workers_running == 2
        assert executor.run(_rank_and_sum, args=[1.5]) == [(0, 3.0), (1, 3.0)]
        # the executable lives in each worker between calls
        assert executor.execute(lambda w: w.step()) == [(0, 0, 1, 21.0), (1, 1, 1, 21.0)]
        assert executor.execute(lambda w: w.step()) == [(0, 0, 2, 21.0), (1, 1, 2, 21.0)]
        refs = executor.run_remote(_rank_and_sum, kwargs={"x": 2.0})
        assert ray.get(refs, timeout=120) == [(0, 4.0), (1, 4.0)]
        assert executor.execute_single(lambda w: (w.built_on_rank, w.calls)) == (0, 2)
        # a function that raises on one worker: its rank and traceback; then every worker is stopped
        with pytest.raises(WorkerFailedError) as info:
            executor.run(_fail_on_zero)
        assert info.value.rank == 0 and "KeyError" in str(info.value)
        assert isinstance(info.value, RankError)  # the typed kind: the user's function raised
        assert "_fail_on_zero" in (info.value.remote_traceback or "")
        assert executor.num_workers_running == 0
        with pytest.raises(ConfigError, match="stopped after a call failed: RankError: rank 0"):
            executor.execute(lambda w: w.step())
        executor.start()  # again, without an executable
        assert executor.run(_rank_and_sum, args=[0.5]) == [(0, 1.0), (1, 1.0)]
        assert executor.execute(lambda w: w) == [None, None]
    finally:
        executor.shutdown()
    assert executor.num_workers_running == 0
    with pytest.raises(ConfigError, match="not started"):
        executor.run(_rank_and_sum, args=[1.0])
    executor.shutdown()  # idempotent


def test_executor_arguments_checked_before_anything_starts():
    from hora.ray import ElasticRayExecutor, RayExecutor

    with pytest.raises(NotImplementedError, match="not supported on Ray: use num_workers"):
        RayExecutor(RayExecutor.create_settings(), min_workers=1, max_workers=2)
    with pytest.raises(NotImplementedError, match="not supported on Ray: use num_workers"):
        ElasticRayExecutor(None)
    with pytest.raises(ConfigError, match="not both"):
        RayExecutor(num_workers=2, num_hosts=1)
    with pytest.raises(ConfigError, match="num_workers must be an int"):
        RayExecutor(num_workers=0)
    with pytest.raises(ConfigError, match="timeout_s"):
        RayExecutor.create_settings(timeout_s=0)
    with pytest.raises(ConfigError, match="one network interface"):
        RayExecutor.create_settings(nics={"eth0", "eth1"})
    with pytest.raises(ConfigError, match="STRICT_SPREAD"):
        RayExecutor(num_hosts=2, num_workers_per_host=2, strategy="PACK")
    with pytest.raises(NotImplementedError, match="report"):
        RayExecutor(num_workers=1).run(print, callbacks=[print])


def _place():
    import hora.torch as hvd

    return hvd.rank(), hvd.local_rank(), hvd.local_size(), hvd.cross_size()


@pytest.mark.timeout(180)
def test_executor_num_hosts_places_workers_per_node_with_extra_env(free_cluster):
    from hora.ray import RayExecutor

    executor = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_hosts=1, num_workers_per_host=2)
    executor.start(extra_env_vars={"HORA_TEST_MARK": "on-every-worker"})
    try:
        assert executor.run(_place) == [(0, 0, 2, 1), (1, 1, 2, 1)]
        assert executor.run(lambda: __import__("os").environ.get("HORA_TEST_MARK")) == ["on-every-worker"] * 2
    finally:
        executor.shutdown()
