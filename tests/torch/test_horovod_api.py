"""hora.torch as a Horovod drop-in, on real processes: Horovod's signatures and names, the
gradients of every collective, sparse gradients, Adasum (against numpy) and elastic.run."""

from __future__ import annotations

import inspect

import pytest

from tests.spawn_util import run_ranks
from tests.torch import horovod_api_workers as W


@pytest.mark.timeout(150)
@pytest.mark.parametrize("size", [2, 3])
def test_collectives_with_horovod_signatures_values_and_gradients(size, tmp_path):
    outs = run_ranks(W.api_checks, size, args=(str(tmp_path),), timeout=140)
    assert outs == [[]] * size, outs


@pytest.mark.timeout(150)
def test_sparse_gradients_groups_warning_and_adasum_optimizer():
    outs = run_ranks(W.optimizer_checks, 2, timeout=140)
    assert outs == [[]] * 2, outs


@pytest.mark.timeout(150)
def test_adasum_equals_numpy_on_two_three_and_four_ranks():
    outs = run_ranks(W.adasum_values, 4, timeout=140)
    assert outs == [[]] * 4, outs


@pytest.mark.timeout(200)
def test_elastic_run_restores_resets_calls_back_and_finishes():
    # a failure on every rank, then on rank 1 only (rank 0's collectives then fail)
    outs = run_ranks(W.elastic_runs, 2, args=([[0, 1], [1]], 4), timeout=190)
    for scenario in range(2):
        runs = [out[scenario] for out in outs]
        for run in runs:
            assert run["steps"] == W.STEPS and run["trace"] == list(range(1, W.STEPS + 1)), (scenario, run)
            assert run["resets"] == [3], (scenario, run)  # restored to the commit of step 3, one reset
            assert run["close"], (scenario, run)  # the same weights as training without the failure
        for name, w in runs[0]["weights"].items():
            assert (w == runs[1]["weights"][name]).all()


def test_every_horovod_torch_name_is_exported_with_horovods_parameters():
    import hora.torch as hvd

    # horovod/torch/__init__.py's names (0.28)
    names = """allgather_object broadcast_object broadcast_optimizer_state broadcast_parameters allreduce
    allreduce_async allreduce_ allreduce_async_ grouped_allreduce grouped_allreduce_async grouped_allreduce_
    grouped_allreduce_async_ sparse_allreduce_async allgather allgather_async grouped_allgather
    grouped_allgather_async broadcast broadcast_async broadcast_ broadcast_async_ alltoall alltoall_async
    reducescatter reducescatter_async grouped_reducescatter grouped_reducescatter_async join barrier poll
    synchronize init shutdown is_initialized start_timeline stop_timeline size local_size cross_size rank
    local_rank cross_rank mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built
    ddl_built ccl_built cuda_built rocm_built ProcessSet global_process_set add_process_set remove_process_set
    Average Sum Adasum Min Max Product HorovodInternalError DistributedOptimizer SyncBatchNorm Compression
    elastic""".split()
    assert [n for n in names if not hasattr(hvd, n)] == []
    assert hasattr(hvd.elastic, "run") and hasattr(hvd.elastic, "TorchState") and hasattr(hvd.elastic,
                                                                                          "ElasticSampler")
    params = {
        "allreduce": ["tensor", "average", "name", "compression", "op", "prescale_factor", "postscale_factor",
                      "process_set"],
        "allreduce_": ["tensor", "average", "name", "op", "prescale_factor", "postscale_factor", "process_set"],
        "grouped_allreduce": ["tensors", "average", "name", "compression", "op", "prescale_factor",
                              "postscale_factor", "process_set"],
        "reducescatter": ["tensor", "name", "compression", "op", "process_set", "prescale_factor",
                          "postscale_factor"],
        "alltoall": ["tensor", "splits", "name", "process_set"],
        "sparse_allreduce_async": ["tensor", "name", "op", "process_set"],
        "join": ["device"],
        "init": ["comm", "process_sets"],
        "start_timeline": ["file_path", "mark_cycles"],
        "DistributedOptimizer": ["optimizer", "named_parameters", "compression", "backward_passes_per_step", "op",
                                 "gradient_predivide_factor", "num_groups", "groups", "sparse_as_dense",
                                 "process_set"],
    }
    for fn, want in params.items():
        got = [p.name for p in inspect.signature(getattr(hvd, fn)).parameters.values()
               if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        assert got == want, (fn, got)


def test_what_hora_cannot_honour_is_refused_by_name():
    import torch

    import hora.torch as hvd
    from hora.errors import ConfigError

    with pytest.raises(ConfigError, match="comm="):
        hvd.init(comm=[0, 1])
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    with pytest.raises(ConfigError, match="groups"):
        hvd.DistributedOptimizer(opt, groups="all")


@pytest.fixture
def one_rank(monkeypatch):
    """hora initialised in this process as a one-rank job (no launcher variables)."""
    import os

    import hora.native as hn

    for k in list(os.environ):
        if k.startswith("HORA_"):
            monkeypatch.delenv(k, raising=False)
    hn.init()
    yield hn
    hn.shutdown()


@pytest.mark.timeout(60)
def test_elastic_sampler_state_host_updates_and_reset_limit(one_rank, monkeypatch):
    from hora.errors import HorovodInternalError, HostsUpdatedInterrupt
    from hora.torch import elastic

    sampler = elastic.ElasticSampler(list(range(10)), shuffle=False)
    assert list(sampler) == list(range(10)) and len(sampler) == 10
    sampler.record_batch(0, 4)
    sampler.load_state_dict(sampler.state_dict())  # the rest of the epoch after a reset
    assert list(sampler) == list(range(4, 10))
    sampler.set_epoch(1)
    assert len(sampler) == 10
    state = elastic.TorchState(sampler=sampler, epoch=3)
    state.sampler.record_batch(0, 2)
    state.commit()
    state.epoch = 9
    state.sampler.record_batch(1, 2)
    state.restore()
    assert state.epoch == 3 and state.sampler.processed_num == 2
    state.on_hosts_updated(1.0, 1)
    with pytest.raises(HostsUpdatedInterrupt):
        state.check_host_updates()
    state.check_host_updates()  # reported once
    # an error at every retry, with no commit in between, is raised after the limit
    monkeypatch.setenv("HORA_ELASTIC_RESET_LIMIT", "2")
    calls = []

    @elastic.run
    def always_fails(st):
        calls.append(1)
        raise HorovodInternalError("always")

    with pytest.raises(HorovodInternalError, match="gave up after 2 resets"):
        always_fails(elastic.ObjectState(lambda o: o, lambda: 0, x=1))
    assert len(calls) == 3
