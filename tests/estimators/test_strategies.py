"""TorchEstimator(strategy=...): 'zero1' and 'zero2' shard the optimizer state (and
the gradients) across the ranks and train as 'hora' does; in their checkpoints each rank writes its own
shards (the ZeRO optimizer's shard files; 'fsdp': torch's distributed checkpoint), so a relaunch continues
where it stopped and a resume at another number of ranks, or with another strategy, reshards. Real ranks on
local processes (a pandas frame)."""

from __future__ import annotations

import io
import re

import numpy as np
import pandas as pd
import pytest
import torch

from hora.errors import ConfigError
from hora.estimators.callbacks import Callback

pytestmark = [pytest.mark.timeout(600)]


def _frame(n: int = 128) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("float64")
    return pd.DataFrame({"features": list(x), "y": y})


def _est(store, **kw):
    from hora.dask import TorchEstimator

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    args = dict(num_proc=2, store=store, model=net, optimizer=torch.optim.AdamW(net.parameters(), lr=0.01),
                loss=torch.nn.CrossEntropyLoss(), feature_cols=["features"], label_cols=["y"], batch_size=16,
                epochs=2, random_seed=0, verbose=0, lr_scaling="none", shuffle=False)
    args.update(kw)
    return TorchEstimator(**args)


class StateProbe(Callback):
    """Logs, at each epoch's start and end, how many parameters have optimizer state on this rank
    (rank 0's logs are the history's) and how many the model has."""

    def on_epoch_begin(self, ctx, epoch):
        self.at_begin = len(ctx.optimizer.state)

    def on_epoch_end(self, ctx, epoch, logs):
        logs["state_at_begin"] = float(self.at_begin)
        logs["state_at_end"] = float(len(ctx.optimizer.state))
        logs["params"] = float(len(list(ctx.model.parameters())))


def _weights(fitted) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in fitted.model_.state_dict().items()}


def _assert_same(a, b):
    for name, value in _weights(a).items():
        np.testing.assert_allclose(_weights(b)[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.timeout(900)
def test_zero1_and_zero2_keep_a_shard_of_the_state_and_train_as_hora_does(store):
    df = _frame()
    hora = _est(store, callbacks=[StateProbe()]).fit(df)
    assert hora.history_[-1]["state_at_end"] == hora.history_[-1]["params"] == 4.0
    for strategy in ("zero1", "zero2"):
        sharded = _est(store, strategy=strategy, callbacks=[StateProbe()]).fit(df)
        # rank 0 keeps AdamW's moments of some of the 4 parameters, not of all
        assert 0 < sharded.history_[-1]["state_at_end"] < 4, (strategy, sharded.history_)
        assert [h["loss"] for h in sharded.history_] == pytest.approx([h["loss"] for h in hora.history_], rel=1e-5)
        _assert_same(hora, sharded)
    # clipping by the global norm: every rank's shard of the gradients counts (zero2 keeps only its own)
    clipped = _est(store, gradient_clip_norm=0.01).fit(df)
    _assert_same(clipped, _est(store, strategy="zero2", gradient_clip_norm=0.01).fit(df))
    with pytest.raises(AssertionError):  # (the bound does bite: without it the weights differ)
        _assert_same(clipped, hora)


class ModelProbe(Callback):
    """Logs what the ranks train: whether the model's parameters are DTensors (FSDP) and how many
    values of them this rank holds, and whether torch.distributed's default group exists (DDP, FSDP)."""

    def on_epoch_end(self, ctx, epoch, logs):
        logs["torch_group"] = float(torch.distributed.is_initialized())
        params = list(ctx.model.parameters())
        logs["dtensor"] = float(all(type(p).__name__ == "DTensor" for p in params))
        logs["local_values"] = float(sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in params))


@pytest.mark.timeout(900)
def test_ddp_and_fsdp_train_as_hora_does_with_validation_and_fsdp_resumes_at_another_size(store):
    df = _frame()
    hora = _est(store, validation=0.25, callbacks=[ModelProbe()]).fit(df)
    full = hora.history_[-1]["local_values"]
    assert full == 4 * 16 + 16 + 16 * 2 + 2 and hora.history_[-1]["dtensor"] == 0.0
    assert hora.history_[-1]["torch_group"] == 0.0  # nothing made unless a strategy asks for it
    for strategy in ("ddp", "fsdp"):
        other = _est(store, strategy=strategy, validation=0.25, callbacks=[ModelProbe()]).fit(df)
        assert [h["loss"] for h in other.history_] == pytest.approx([h["loss"] for h in hora.history_], rel=1e-5)
        assert [h["val_loss"] for h in other.history_] == pytest.approx([h["val_loss"] for h in hora.history_],
                                                                         rel=1e-5)
        assert other.history_[-1]["torch_group"] == 1.0
        _assert_same(hora, other)  # the driver's model is a plain module with the whole weights
        assert type(other.model_[0].weight).__name__ != "DTensor"
        if strategy == "fsdp":  # each rank held a shard of every parameter
            assert other.history_[-1]["dtensor"] == 1.0 and other.history_[-1]["local_values"] < full
    # FSDP with clipping by the norm of the whole model (each rank holds a shard of each gradient)
    _assert_same(_est(store, gradient_clip_norm=0.01).fit(df),
                 _est(store, strategy="fsdp", gradient_clip_norm=0.01).fit(df))

    # an FSDP run of 2 ranks checkpoints with torch's distributed checkpoint: each rank its shards, in a
    # folder beside the committed checkpoint, which names the folder and holds no weights
    _est(store, strategy="fsdp", epochs=1, run_id="fsdp-resize").fit(df)
    folder = store.layout.checkpoint_dir("fsdp-resize")
    shards = [e.rstrip("/").rsplit("/", 1)[-1] for e in store.listdir(folder) if "dcp-" in e]
    assert len(shards) == 1 and re.fullmatch(r"dcp-e\d{6}-s000000-g000000004-a1", shards[0]), shards  # 4 steps
    files = sorted(e.rsplit("/", 1)[-1] for e in store.listdir(f"{folder}/{shards[0]}"))
    assert files == [".hora-checksums.json", ".metadata", "__0_0.distcp", "__1_0.distcp"], files
    committed = torch.load(io.BytesIO(store.latest_checkpoint("fsdp-resize")[1]), weights_only=False)
    assert committed["dcp"] == shards[0] and "model" not in committed and "optimizer" not in committed
    # another model's fit does not load it: the driver reads the shards' metadata, and names the difference
    wider = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with pytest.raises(ConfigError, match=r"checkpoint of epoch 0 of run fsdp-resize .* belongs to another model: "
                                          r"'0.weight' has shape \(16, 4\) in the checkpoint, \(8, 4\) in the model"):
        _est(store, strategy="fsdp", epochs=2, run_id="fsdp-resize", model=wider,
             optimizer=torch.optim.AdamW(wider.parameters(), lr=0.01)).fit(df)
    # resumed by one rank (DCP reshards), then by 'hora' (which loads it whole)
    resized = _est(store, strategy="fsdp", epochs=2, num_proc=1, run_id="fsdp-resize",
                   callbacks=[StateProbe()]).fit(df)
    assert [(h["epoch"], h["num_proc"]) for h in resized.history_] == [(0, 2), (1, 1)]
    assert resized.history_[-1]["state_at_begin"] == 4.0
    plain = _est(store, epochs=3, run_id="fsdp-resize", callbacks=[StateProbe()]).fit(df)
    assert plain.history_[-1]["epoch"] == 2 and plain.history_[-1]["state_at_begin"] == 4.0


@pytest.mark.timeout(900)
def test_a_fit_of_each_strategy_relaunched_after_a_kill_continues_and_a_resume_at_another_size_reshards(store):
    from tests.estimators.recovery_callbacks import KillRank

    df = _frame()
    whole = _est(store, epochs=3, run_id="whole").fit(df)
    for strategy in ("zero2", "ddp", "fsdp"):
        relaunched = _est(store, strategy=strategy, epochs=3, run_id=f"{strategy}-relaunch", max_failures=1,
                          checkpoint_every="1 step", callbacks=[KillRank(rank=1, epoch=1, step=2)]).fit(df)
        assert [h["attempt"] for h in relaunched.history_] == [1, 2, 2], strategy
        _assert_same(whole, relaunched)  # AdamW's moments came back from the mid-epoch checkpoint

    # 2 ranks write the checkpoint of epoch 1; one rank resumes from it and holds every parameter's state
    _est(store, strategy="zero1", epochs=1, run_id="zero-resize").fit(df)
    epoch, data = store.latest_checkpoint("zero-resize")  # each rank wrote its shard; nothing was gathered
    committed = torch.load(io.BytesIO(data), weights_only=False)
    assert "optimizer" not in committed and committed["zero"].startswith("zero-e000000-"), sorted(committed)
    folder = f"{store.layout.checkpoint_dir('zero-resize')}/{committed['zero']}"
    assert sorted(str(e).rstrip("/").rsplit("/", 1)[-1] for e in store.listdir(folder)) == [  # each with its checksum
        "shard-00000-of-00002.pt", "shard-00000-of-00002.pt.sum", "shard-00001-of-00002.pt",
        "shard-00001-of-00002.pt.sum"]
    resized = _est(store, strategy="zero1", epochs=2, num_proc=1, run_id="zero-resize",
                   callbacks=[StateProbe()]).fit(df)
    assert [(h["epoch"], h["num_proc"]) for h in resized.history_] == [(0, 2), (1, 1)]
    assert resized.history_[-1]["state_at_begin"] == 4.0  # loaded before the first step of the resumed epoch
    # and a 'hora' fit resumes from a sharded run's checkpoint (torch's own format)
    plain = _est(store, epochs=3, run_id="zero-resize", callbacks=[StateProbe()]).fit(df)
    assert plain.history_[-1]["epoch"] == 2 and plain.history_[-1]["state_at_begin"] == 4.0


def test_strategies_that_cannot_run_fail_on_the_driver(store):
    from hora.native.compression import fp16

    df = _frame(n=32)
    with pytest.raises(ConfigError, match="strategy must be one of 'hora', 'zero1', 'zero2', 'ddp', 'fsdp'"):
        _est(store, strategy="zero3").fit(df)
    with pytest.raises(ConfigError, match="gradient_compression applies to hora's allreduce"):
        _est(store, strategy="ddp", gradient_compression=fp16).fit(df)
    net = torch.nn.Linear(4, 2)
    with pytest.raises(ConfigError, match="LBFGS keeps state across parameters"):
        _est(store, strategy="zero1", model=net, optimizer=torch.optim.LBFGS(net.parameters())).fit(df)
    assert not store.exists("runs")


@pytest.mark.dask
@pytest.mark.timeout(600)
def test_fsdp_on_a_dask_cluster_with_a_torchmetrics_metric_synced_once(dask_client, store):
    """On torch.distributed's group a torchmetrics metric's compute() gives every rank the value of
    all ranks' rows: the validation accuracy equals the 'hora' fit's (per-rank values averaged by
    rows), not a double count."""
    torchmetrics = pytest.importorskip("torchmetrics")
    import dask.dataframe as dd

    df = dd.from_pandas(_frame(), npartitions=2)
    accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=2, average="micro")
    fits = {s: _est(store, strategy=s, validation=0.25, metrics={"acc": accuracy}).fit(df)
            for s in ("hora", "fsdp")}
    hora, fsdp = fits["hora"].history_, fits["fsdp"].history_
    assert 0.5 < hora[-1]["val_acc"] <= 1.0
    assert [h["val_acc"] for h in fsdp] == pytest.approx([h["val_acc"] for h in hora], abs=1e-6)
    _assert_same(fits["hora"], fits["fsdp"])
