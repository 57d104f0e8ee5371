"""hora.lightning on 2 real processes over loopback Gloo, for both Lightning import names:
the Strategy matches one process on the whole batch (plain SGD, accumulation with clipping,
scaled learning rates with a scheduler), reduces ``sync_dist`` metrics and Lightning's
collectives through hora, writes checkpoints on rank 0 only and resumes at the right epoch
and step; ``fit_module`` with per-rank batches and with a DataModule, resume from its
checkpoint bytes, stop requests, Lightning 1.x hooks, uneven batch counts.

One launch of 2 ranks (module-scoped fixture) runs every scenario under ``lightning``, then, in the
same processes, the two entry points (the Strategy with ``sgd``, ``fit_module`` with its resume)
under ``pytorch_lightning``: they prove the second import name works (the code is shared, and
tests/lightning/test_lightning_checks.py covers telling the two apart); every scenario reports on its own.
"""

from __future__ import annotations

import importlib.util
import pickle

import pytest
import torch

from tests import rank_results
from tests.lightning import workers as W
from tests.rank_results import assert_close, assert_identical
from tests.spawn_util import run_ranks

PACKAGES = ["lightning", "pytorch_lightning"]
#: the scenarios run under the second import name as well (the others under ``lightning`` only)
BOTH_NAMES = ("sgd", "fit_module")
SIZE = 2

pytestmark = pytest.mark.timeout(600)  # the first test of each package pays for the launch

#: a test of a scenario that runs under both import names / under ``lightning`` only
under_both_names = pytest.mark.parametrize("ranks", PACKAGES, indirect=True)
under_lightning = pytest.mark.parametrize("ranks", PACKAGES[:1], indirect=True)


@pytest.fixture(scope="module")
def launch(tmp_path_factory) -> list[dict]:
    """Each rank's ``{package: {scenario: (ok, result)}}`` for the installed import names."""
    plan = [(package, None if package == PACKAGES[0] else BOTH_NAMES) for package in PACKAGES
            if importlib.util.find_spec(package) is not None]
    if not plan:
        return [{}] * SIZE
    out = run_ranks(W.run_all_scenarios, SIZE, args=(plan, str(tmp_path_factory.mktemp("lightning"))), timeout=540)
    return [pickle.loads(b) for b in out]


@pytest.fixture()
def ranks(request, launch) -> tuple[str, list[dict]]:
    package = request.param
    if package not in launch[0]:
        pytest.skip(f"{package} is not installed (pip install -c constraints.txt 'hora[lightning]')")
    return package, [per_rank[package] for per_rank in launch]


def result(ranks: tuple[str, list[dict]], name: str) -> list:
    package, per_rank = ranks
    return rank_results.result(per_rank, name, label=package)


# ---------------------------------------------------------------------------- the Strategy
@under_both_names
def test_plain_sgd_matches_one_process_on_the_whole_batch(ranks):
    res = result(ranks, "sgd")
    assert_identical([r["state"] for r in res], "sgd")
    want, _ = W.reference(epochs=2, shuffled=True)
    assert_close(res[0]["state"], want, 1e-6, "sgd vs one process")
    for r in res:
        assert r["global_step"] == 2 * W.STEPS
        assert r["lr"] == W.LR  # scale_lr=False
        assert r["hooks_left"] == 0  # teardown removed the gradient hooks
        assert r["allreduce_after"] == 1.0  # 0 + 1: hora still works after fit


@under_lightning
def test_accumulation_with_clipping_matches_one_process(ranks):
    res = result(ranks, "accumulate_clip")
    assert_identical([r["state"] for r in res], "accumulate")
    want, max_norm = W.reference(epochs=2, momentum=0.9, accumulate=2, clip=0.5, shuffled=True)
    assert max_norm > 0.5, "the reference never clipped: the test would not check clipping"
    assert_close(res[0]["state"], want, 1e-5, "accumulate_grad_batches=2 + clip vs one process")
    # 3 batches per epoch: a full window of 2, then the last batch alone
    assert [r["global_step"] for r in res] == [4, 4]


@under_lightning
def test_default_scales_learning_rate_and_scheduler_follows(ranks):
    res = result(ranks, "scale_lr")
    assert_identical([r["state"] for r in res], "scale_lr")
    want, _ = W.reference(epochs=2, lr=W.LR * SIZE, scheduler=True, shuffled=True)
    assert_close(res[0]["state"], want, 1e-6, "lr x size with StepLR vs one process")
    for r in res:
        assert r["base_lrs"] == pytest.approx([W.LR * SIZE])
        assert r["lr"] == pytest.approx(W.LR * SIZE * 0.25)  # StepLR(1, 0.5) after 2 epochs
        assert r["follows"]


@under_lightning
def test_sync_batchnorm_uses_hora_and_is_reverted(ranks):
    res = result(ranks, "sync_batchnorm")
    # each rank normalized different rows: equal running statistics mean they were synchronized
    assert_identical([r["state"] for r in res], "sync_batchnorm")
    assert res[0]["state"]["net.1.num_batches_tracked"] == W.STEPS
    assert all(r["class"].endswith("layer_sync._BatchNormXd") for r in res), res[0]["class"]


@under_lightning
def test_sync_dist_metrics_are_reduced_through_hora(ranks):
    res = result(ranks, "metrics")
    for rank, r in enumerate(res):
        m = r["metrics"]
        assert m["rank_mean"] == pytest.approx(0.5)
        assert m["rank_sum"] == pytest.approx(W.STEPS * (1 + 2))  # per rank sum over steps, then summed
        assert m["rank_max"] == 1.0
        assert m["rank_local"] == float(rank)  # without sync_dist each rank keeps its own
    assert res[0]["metrics"]["train_loss"] == res[1]["metrics"]["train_loss"]


@under_lightning
def test_lightning_collectives_go_through_hora(ranks):
    for rank, r in enumerate(result(ranks, "metrics")):
        assert r["sum"] == 3.0 and r["mean"] == 1.5 and r["max"] == 1.0
        assert r["int_mean"].dtype == torch.int64 and int(r["int_mean"]) == 2
        assert r["not_tensor"] == "text"
        assert r["gather_shape"] == (SIZE, 2)
        assert r["gather_scalar"] == [0.0, 1.0]
        assert r["grad"] == 3.0  # all_gather(sync_grads=True): the gradient summed over ranks
        assert r["broadcast"] == {"from": 1}
        assert r["all_true"] is False and r["any_true"] is True


@under_lightning
def test_checkpoints_by_rank_zero_and_resume_at_epoch_and_step(ranks):
    res = result(ranks, "checkpoint_resume")
    assert res[0]["saved"] and res[1]["saved"] == []  # rank 0 alone wrote
    assert "last.ckpt" in res[0]["files"] and res[0]["files"] == res[1]["files"]
    for r in res:
        assert r["epochs"] == [2, 3]  # resumed at the third epoch, not from the start
        assert r["global_step"] == 4 * W.STEPS and r["current_epoch"] == 4
        assert r["lr"] == pytest.approx(W.LR * SIZE * 0.5 ** 4)  # the scheduler resumed too
    assert_identical([r["state"] for r in res], "resume")
    # momentum buffers and the LR schedule must have come back from the checkpoint
    want, _ = W.reference(epochs=4, lr=W.LR * SIZE, momentum=0.9, scheduler=True, shuffled=True)
    assert_close(res[0]["state"], want, 1e-5, "2 epochs + resume to 4 vs 4 epochs in one process")


# ---------------------------------------------------------------------------- fit_module
@under_both_names
def test_fit_module_on_per_rank_batches_and_resume_from_its_checkpoint(ranks):
    res = result(ranks, "fit_module")
    first = [r["first"] for r in res]
    assert [len(f["history"]) for f in first] == [3, 3]
    assert first[0]["history"] == first[1]["history"]  # averaged across ranks
    assert [row["epoch"] for row in first[0]["history"]] == [0, 1, 2]
    for row in first[0]["history"]:
        assert {"loss", "train_loss", "val_loss"} <= row.keys()
        assert row["loss"] == pytest.approx(row["train_loss"], rel=1e-5)
    assert first[0]["has_checkpoint"] and not first[1]["has_checkpoint"]
    for rank, r in enumerate(res):
        assert [s[0] for s in r["seen"]] == [0, 1, 2]
        assert [s[2] for s in r["seen"]] == [3, 6, 9]  # global step after each epoch
        assert all(s[3] == (rank == 0) for s in r["seen"])  # checkpoint bytes on rank 0 only
        assert all(s[1] == ["loss", "train_loss", "val_loss"] for s in r["seen"])
        assert r["batches_seen"] == [(e, b, e * W.STEPS + b + 1, True) for e in range(3) for b in range(W.STEPS)]
    assert res[0]["tb_files"] > 0 and res[1]["tb_files"] == 0  # TensorBoardLogger writes on rank 0
    want3, _ = W.reference(epochs=3)
    assert_close(first[0]["state"], want3, 1e-6, "fit_module 3 epochs vs one process")

    second = [r["second"] for r in res]
    for s in second:
        assert s["start_epoch"] == 3 and s["epochs_run"] == 5 and s["global_step"] == 5 * W.STEPS
        assert [row["epoch"] for row in s["history"]] == [0, 1, 2, 3, 4]  # restored rows kept
        assert s["history"][:3] == first[0]["history"]
    assert_identical([r["state"] for r in res], "fit_module resumed")
    want5, _ = W.reference(epochs=5)
    assert_close(res[0]["state"], want5, 1e-6, "3 epochs + resume to 5 vs 5 epochs in one process")
    for r in res:  # resuming a finished run trains nothing and keeps the history
        assert r["again_epochs"] == 5 and r["again_history"] == 5


@under_lightning
def test_fit_module_with_a_datamodule_bf16_accumulation_and_csv_logger(ranks):
    res = result(ranks, "fit_module_datamodule")
    assert_identical([r["state"] for r in res], "datamodule")
    assert all(torch.isfinite(v).all() for v in res[0]["state"].values())
    for r in res:
        assert [row["epoch"] for row in r["history"]] == [0, 1]
        assert {"loss", "train_loss", "val_loss"} <= r["history"][0].keys()
        assert r["global_step"] == 4  # 3 batches per rank and epoch, 2 per step: 2 steps per epoch
    assert res[0]["history"][1]["loss"] < res[0]["history"][0]["loss"]
    assert res[0]["csv_files"] == ["metrics.csv"] and res[1]["csv_files"] == []


@under_lightning
def test_fit_module_stops_every_rank_when_one_asks(ranks):
    for r in result(ranks, "stop_on_request"):
        assert r["epochs"] == [0, 1] and r["stopped_early"]


@under_lightning
def test_fit_module_runs_lightning_1_hooks_of_horovods_example(ranks):
    for r in result(ranks, "legacy_hooks"):
        assert r["checked"]  # the example's own assertion in on_train_end ran and held
        assert r["init_calls"] == 2
        assert (r["train_end"], r["val_end"], r["epoch_end"]) == (2, 2, 4)
        assert r["class_restored"]
        assert all("avg_val_loss" in row for row in r["history"])  # logged by validation_epoch_end


@under_lightning
def test_fit_module_refuses_different_batch_counts(ranks):
    for msg in result(ranks, "uneven_batches"):
        assert "rank 0: 2, rank 1: 3" in msg


@under_lightning
def test_fit_module_terminate_on_nan(ranks):
    for rank, msg in enumerate(result(ranks, "terminate_on_nan")):
        assert f"rank {rank}: the training loss is nan at epoch 0, batch 0 (terminate_on_nan)" in msg
