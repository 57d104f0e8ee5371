"""hora.torch on 2 real processes over loopback Gloo: DistributedOptimizer parity with one
process on the whole batch, compression, backward_passes_per_step, unused parameters,
overlap, broadcast of parameters / optimizer state / objects, SyncBatchNorm parity; and
the argument errors, checked in this process."""

from __future__ import annotations

import pickle

import pytest
import torch

from hora.errors import ConfigError
from tests.rank_results import assert_close, assert_identical, result
from tests.spawn_util import run_ranks
from tests.torch import workers as W


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    """Every scenario of workers.SCENARIOS, run once on 2 ranks."""
    return [pickle.loads(b) for b in run_ranks(W.run_all_scenarios, 2, timeout=240)]


# ---------------------------------------------------------------------------- parity
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "scenario,opt_kind,loss_scale",
    [
        ("sgd", "sgd", 1.0),
        ("adam", "adam", 1.0),
        ("sgd_bpps2", "sgd", 1.0),
        ("adam_bpps2", "adam", 1.0),
        ("buckets", "adam", 1.0),  # gradients submitted in 2 buckets instead of one by one
        ("predivide", "sgd", 1.0),
        ("sum_op", "plain_sgd", 2.0),  # Sum of two half-batch means = 2x the whole-batch mean
        ("per_name", "sgd", 1.0),  # gradient_as_bucket_view=False: each gradient by its name
        ("keep_grads", "sgd", 1.0),  # zero_grad(set_to_none=False): autograd adds into the views
        ("adam_keep_grads_bpps2", "adam", 1.0),
    ],
)
def test_two_ranks_on_half_batches_match_one_process(ranks, scenario, opt_kind, loss_scale):
    states = result(ranks, scenario)
    assert_identical(states, scenario)
    want = W.reference_train(opt_kind, loss_scale=loss_scale)
    assert_close(states[0], want, 1e-5, scenario)
    # and training moved the weights (a no-op would also be "identical on both ranks")
    start = W.make_mlp(seed=0).state_dict()
    assert any((start[k] - want[k]).abs().max() > 1e-3 for k in want)


@pytest.mark.timeout(300)
def test_bucket_views_give_bitwise_the_per_name_result(ranks):
    # flat buckets fold the average's 1/2 into the copy into the bucket and sum; matching
    # by name sums, then scales: for a power-of-two size the two are bitwise equal
    flat, by_name = result(ranks, "sgd"), result(ranks, "per_name")
    for k in flat[0]:
        assert torch.equal(flat[0][k], by_name[0][k]), k
    for r, res in enumerate(result(ranks, "bucket_views")):
        assert res["buckets"] == 1 and res["storages"] == 1, res  # every .grad a view of one buffer
        if r:
            for g0, g in zip(result(ranks, "bucket_views")[0]["grads"], res["grads"], strict=True):
                assert torch.equal(g0, g)  # the averaged gradient, the same on both ranks


@pytest.mark.timeout(300)
def test_bucket_layout_that_differs_across_ranks_is_refused(ranks):
    for r, res in enumerate(result(ranks, "layout_mismatch")):
        msg = res[True]
        assert "gradient bucket 0 differs between this rank" in msg, msg
        assert f"rank {1 - r}" in msg and "gradient_as_bucket_view=False" in msg, msg
        assert res[False] == "ok"  # matched by name, the order does not matter


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario,atol", [("fp16", 2e-3), ("bf16", 2e-2)])
def test_compressed_gradients_stay_close(ranks, scenario, atol):
    states = result(ranks, scenario)
    assert_identical(states, scenario)
    assert_close(states[0], W.reference_train("sgd"), atol, scenario)


@pytest.mark.timeout(300)
def test_parameter_unused_on_some_ranks_and_steps(ranks):
    states = result(ranks, "two_heads")
    assert_identical(states, "two_heads")
    assert_close(states[0], W.reference_two_heads(), 1e-5, "two_heads")


@pytest.mark.timeout(300)
def test_scheduler_made_before_wrapping_and_step_with_closure(ranks):
    want = W.reference_scheduled_closure()
    outs = result(ranks, "scheduled_closure")
    assert_identical([o["state"] for o in outs], "scheduled_closure")  # step() synchronized
    for o in outs:
        assert_close(o["state"], want["state"], 1e-5, "scheduled_closure")
        assert o["losses"] == pytest.approx(want["losses"], rel=1e-5)  # the closure's loss, returned
        assert o["lrs"] == pytest.approx([0.1 * 0.5 ** (i + 1) for i in range(W.STEPS)])
        assert o["warnings"] == [], o["warnings"]


@pytest.mark.timeout(300)
def test_overlapped_path_matches_blocking_per_gradient_allreduce(ranks):
    for r, res in enumerate(result(ranks, "overlap")):
        assert_close(res["overlapped"], res["manual"], 1e-6, f"overlap rank {r}")
        # each step, every gradient was already submitted when backward returned
        assert res["in_flight"] == [res["names"]] * W.STEPS
    assert_close(result(ranks, "overlap")[0]["overlapped"], W.reference_train("sgd"), 1e-5, "overlap")


@pytest.mark.timeout(300)
def test_rank_alone_in_its_process_set_steps_locally(ranks):
    for r, res in enumerate(result(ranks, "process_set")):
        assert_close(res["distributed"], res["local"], 0.0, f"process_set rank {r}")


# ---------------------------------------------------------------------------- broadcast
@pytest.mark.timeout(300)
def test_broadcast_optimizer_state(ranks):
    r0, r1 = result(ranks, "optimizer_state")
    a0, a1 = r0["adam"], r1["adam"]
    assert a0["param_groups"] == a1["param_groups"]
    assert a1["param_groups"][0]["lr"] == 0.05 and a1["param_groups"][0]["betas"] == (0.8, 0.99)
    assert a0["state"].keys() == a1["state"].keys() and len(a0["state"]) == 4
    for pid in a0["state"]:
        assert a0["state"][pid].keys() == a1["state"][pid].keys() == {"step", "exp_avg", "exp_avg_sq"}
        for k, v in a0["state"][pid].items():
            assert torch.equal(v, a1["state"][pid][k]), (pid, k)
        assert float(a1["state"][pid]["step"]) == 2.0
    # an empty root state empties the others
    assert r0["sgd_empty_root"] == r1["sgd_empty_root"] == {"state": 0}
    assert r0["lr_from_rank1"] == r1["lr_from_rank1"] == 0.25


@pytest.mark.timeout(300)
def test_broadcast_and_allgather_object(ranks):
    r0, r1 = result(ranks, "objects")
    assert r0["broadcast"] == r1["broadcast"] == {"from": 1, "data": [1, 2]}
    assert r0["allgather"] == r1["allgather"] == [("rank", 0), ("rank", 1)]


@pytest.mark.timeout(300)
def test_elastic_torch_state_sync_commit_restore(ranks):
    r0, r1 = result(ranks, "elastic_state")
    want = W.make_mlp(seed=0).state_dict()
    for res in (r0, r1):
        weights, epoch, history = res["synced"]
        assert_close(weights, dict(want), 0.0, "synced")
        assert (epoch, history) == (10, [0])
        c_weights, c_opt, c_epoch, c_hist = res["committed"]
        r_weights, r_opt, r_epoch, r_hist = res["restored"]
        assert_close(r_weights, c_weights, 0.0, "restored")
        assert (r_epoch, r_hist) == (c_epoch, c_hist) == (11, [0, "a"])
        for pid, st in c_opt["state"].items():
            assert float(r_opt["state"][pid]["step"]) == float(st["step"]) == 1.0
            assert torch.equal(r_opt["state"][pid]["exp_avg"], st["exp_avg"])
    assert_identical([r0["restored"][0], r1["restored"][0]], "elastic")


# ---------------------------------------------------------------------------- SyncBatchNorm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", ["sync_bn", "sync_bn2d"])
def test_sync_batch_norm_matches_batch_norm_on_whole_batch(ranks, scenario):
    r0, r1 = result(ranks, scenario)
    want = W.reference_sync_bn(two_d=scenario == "sync_bn2d")
    for key in ("y", "x_grad", "eval_y"):
        got = torch.cat([r0[key], r1[key]])
        diff = (got - want[key]).abs().max().item()
        assert diff < 1e-5, f"{key} differs by {diff:.3g}"
    for key in ("weight_grad", "bias_grad", "running_mean", "running_var"):
        for r, res in enumerate((r0, r1)):
            diff = (res[key] - want[key]).abs().max().item()
            assert diff < 1e-5, f"rank {r}: {key} differs by {diff:.3g}"


# ---------------------------------------------------------------------------- misuse
@pytest.mark.timeout(300)
def test_zero_grad_in_flight_and_too_many_backward_passes(ranks):
    for res in result(ranks, "misuse"):
        assert res["grads_after_zero_grad"] == [None] * 4
        kind, msg = res["third_pass"]
        assert kind == "ConfigError" and "backward_passes_per_step=2" in msg, res["third_pass"]


# ---------------------------------------------------------------------------- argument errors (no processes)
def _model_and_opt():
    model = W.make_mlp(seed=0)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.mark.timeout(60)
def test_wrapper_is_an_instance_of_the_wrapped_class():
    import hora.torch as hvd

    model, opt = _model_and_opt()
    dist = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    assert isinstance(dist, torch.optim.SGD) and type(dist).__name__ == "SGD"
    assert dist.param_groups is opt.param_groups
    assert dist.state_dict()["param_groups"][0]["lr"] == 0.1
    assert hvd.is_distributed_optimizer(dist) and not hvd.is_distributed_optimizer(opt)
    assert [len(b) for b in dist._hora_buckets] == [4]  # default: buckets of up to 25 MiB
    one_by_one = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), bucket_cap_mb=0)
    assert [len(b) for b in one_by_one._hora_buckets] == [1, 1, 1, 1]
    big = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    # on the CPU no small first bucket (it would buy no overlap, only a round per step)
    assert len(hvd.DistributedOptimizer(torch.optim.SGD(big.parameters(), lr=0.1))._hora_buckets) == 1
    big_opt = hvd.DistributedOptimizer(torch.optim.SGD(big.parameters(), lr=0.1), first_bucket_mb=1)
    nbytes = [sum(p.numel() * 4 for p in b) for b in big_opt._hora_buckets]
    assert len(nbytes) == 2 and nbytes[0] <= 1024 * 1024 < nbytes[0] + 257 * 1024  # then the rest (< 25 MiB)
    assert big_opt._hora_buckets[0][0] is list(big.parameters())[-1]  # reverse order: backward's
    bucketed = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), bucket_cap_mb=0.0005)
    assert [len(b) for b in bucketed._hora_buckets] == [3, 1]  # 16+256+64 bytes, then 512 bytes
    with pytest.raises(ConfigError, match="already a DistributedOptimizer"):
        hvd.DistributedOptimizer(dist)


@pytest.mark.timeout(60)
def test_named_parameters_errors():
    import hora.torch as hvd

    model, opt = _model_and_opt()
    named = list(model.named_parameters())
    dup = [named[0], ("0.weight", named[1][1])] + named[2:]
    with pytest.raises(ConfigError, match=r"'0.weight' twice"):
        hvd.DistributedOptimizer(opt, named_parameters=dup)
    with pytest.raises(ConfigError, match=r"does not name these parameters.*\['params'\]\[3\] \(shape \(4,\)\)"):
        hvd.DistributedOptimizer(opt, named_parameters=named[:3])
    with pytest.raises(ConfigError, match="pairs"):
        hvd.DistributedOptimizer(opt, named_parameters=[p for _, p in named])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"backward_passes_per_step": 0}, "backward_passes_per_step"),
        ({"backward_passes_per_step": 1.5}, "backward_passes_per_step"),
        ({"op": "mean"}, "op must be"),
        ({"gradient_predivide_factor": 0.0}, "gradient_predivide_factor"),
        ({"gradient_predivide_factor": 2.0, "op": "SUM"}, "op"),
        ({"compression": "zip"}, "compression"),
        ({"bucket_cap_mb": -1}, "bucket_cap_mb"),
        ({"gradient_as_bucket_view": "yes"}, "gradient_as_bucket_view must be True or False"),
        ({"first_bucket_mb": 0}, "first_bucket_mb must be a number > 0"),
    ],
)
def test_bad_arguments(kwargs, match):
    import hora.torch as hvd

    if kwargs.get("op") == "SUM":
        kwargs = dict(kwargs, op=hvd.Sum)
    model, opt = _model_and_opt()
    with pytest.raises(ConfigError, match=match):
        hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **kwargs)
    with pytest.raises(ConfigError, match="torch.optim.Optimizer"):
        hvd.DistributedOptimizer(model)


@pytest.mark.timeout(60)
def test_broadcast_parameters_rejects_bad_input():
    import hora.torch as hvd

    with pytest.raises(ConfigError, match="state_dict"):
        hvd.broadcast_parameters(torch.zeros(3))
    with pytest.raises(ConfigError, match="'w' is int"):
        hvd.broadcast_parameters({"w": 3})
    with pytest.raises(ConfigError, match="SyncBatchNorm expects input of shape"):
        hvd.SyncBatchNorm(3)(torch.zeros(3))
