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
@pytest.mark.parametrize("size", [2, 3])
def test_sparse_gradients_groups_warning_and_adasum_optimizer(size):
    outs = run_ranks(W.optimizer_checks, size, timeout=140)
    assert outs == [[]] * size, outs


@pytest.mark.timeout(150)
def test_adasum_equals_numpy_on_two_three_and_four_ranks():
    outs = run_ranks(W.adasum_values, 4, timeout=140)
    assert outs == [[]] * 4, outs


@pytest.mark.timeout(150)
@pytest.mark.parametrize("fail_ranks", [[0, 1], [1]], ids=["every-rank", "one-rank"])
def test_elastic_run_restores_resets_calls_back_and_finishes(fail_ranks):
    outs = run_ranks(W.elastic_run, 2, args=(fail_ranks, 4), timeout=140)
    for out in outs:
        assert out["steps"] == W.STEPS and out["trace"] == list(range(1, W.STEPS + 1)), out
        assert out["resets"] == [3], out  # restored to the commit of step 3, one reset
        assert out["close"], out  # the same weights as training without the failure
    for name, w in outs[0]["weights"].items():
        assert (w == outs[1]["weights"][name]).all()


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
