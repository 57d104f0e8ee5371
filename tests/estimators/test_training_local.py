"""The worker loop on real processes (local runner, pandas input): resume, callbacks, metrics."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tests.estimators.frames import mlp

pytestmark = pytest.mark.timeout(400)


def _est(store, **kw):
    from hora.dask import TorchEstimator

    net = mlp()
    args = dict(num_proc=2, store=store, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
                loss=torch.nn.MSELoss(), feature_cols=["features"], label_cols=["y"], batch_size=32,
                epochs=2, validation=0.25, random_seed=0, verbose=0)
    args.update(kw)
    return TorchEstimator(**args)


def test_fit_with_existing_run_id_resumes_from_last_checkpoint(reg_pandas, store):
    first = _est(store, run_id="resume-me", epochs=2).fit(reg_pandas)
    assert [h["epoch"] for h in first.history_] == [0, 1]
    assert store.list_checkpoints("resume-me") == [0, 1]
    second = _est(store, run_id="resume-me", epochs=4).fit(reg_pandas)
    # epochs 0-1 come from the checkpoint's history, 2-3 were trained now
    assert [h["epoch"] for h in second.history_] == [0, 1, 2, 3]
    assert second.history_[:2] == first.history_
    assert store.list_checkpoints("resume-me") == [0, 1, 2, 3]
    assert second.history_[-1]["val_loss"] < first.history_[-1]["val_loss"]
    assert store.read_json(store.layout.history_path("resume-me"))[-1]["epoch"] == 3


def test_early_stopping_and_best_model_checkpoint(reg_pandas, store):
    from hora.estimators.callbacks import BestModelCheckpoint, EarlyStopping

    # min_delta so large that no epoch after the first counts as an improvement
    early = EarlyStopping(monitor="val_loss", patience=1, min_delta=1e9)
    best = BestModelCheckpoint(monitor="val_loss")
    model = _est(store, epochs=10, callbacks=[early, best], run_id="early").fit(reg_pandas)
    assert [h["epoch"] for h in model.history_] == [0, 1, 2]
    assert store.exists(store.layout.run_dir("early") + "/best.ckpt")
    # the returned weights are the best epoch's (restored), not the last one's
    ckpt = torch.load(store.layout.run_dir("early") + "/best.ckpt", weights_only=False)
    for name, value in model.model_.state_dict().items():
        assert torch.equal(value, ckpt["model"][name])


def test_metrics_lr_override_and_sample_weights(store):
    import torchmetrics

    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 4)).astype("float32")
    label = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0).astype("int64")
    df = pd.DataFrame({"features": list(x), "label": label, "w": np.where(label == 2, 2.0, 1.0)})
    net = mlp(out=3)
    est = _est(store, model=net, optimizer=lambda params: torch.optim.SGD(params, lr=123.0),
               learning_rate=0.05, loss=torch.nn.CrossEntropyLoss(), label_cols=["label"],
               sample_weight_col="w", epochs=3, metrics=[torchmetrics.Accuracy(task="multiclass", num_classes=3)])
    model = est.fit(df)
    hist = model.history_
    assert {"val_loss", "val_multiclassaccuracy"} <= set(hist[-1])
    assert 0.0 <= hist[-1]["val_multiclassaccuracy"] <= 1.0
    # lr 123 would diverge (NaN loss fails the fit); the override 0.05 x 2 ranks trains
    assert np.isfinite(hist[-1]["loss"]) and hist[-1]["loss"] < hist[0]["loss"]
    out = model.transform(df.head(10))
    # CrossEntropyLoss makes a classifier: its logits (arrays of 3 doubles), probabilities and class index
    assert out["rawPrediction"].map(len).eq(3).all() and out["probability"].map(len).eq(3).all()
    assert out["prediction"].isin([0.0, 1.0, 2.0]).all()


def _double_first(batch):
    """A transformation_fn that changes a member of the feature group (it must see the members)."""
    batch = dict(batch)
    batch["a"] = batch["a"] * 2.0
    return batch


def test_feature_group_with_and_without_transformation_fn_and_the_step_profile(store):
    """Without a transformation_fn the reader stacks the group; with one, the function sees the
    members and the worker stacks what it returns: both train the same model on the same rows.
    Rank 0's epoch profile counts every step and splits train_step into its parts."""
    from hora.dask import TorchEstimator
    from hora.estimators.driver import fit as core

    rng = np.random.default_rng(3)
    n = 256
    df = pd.DataFrame({"a": rng.random(n, dtype=np.float32), "b": rng.random(n, dtype=np.float32)})
    df["y"] = (2.0 * df["a"] + df["b"]).astype("float64")

    def fit(**kw):
        net = mlp(d=2)
        est = TorchEstimator(num_proc=2, store=store, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.05),
                             loss=torch.nn.MSELoss(), feature_cols=[["a", "b"]], label_cols=["y"], batch_size=16,
                             epochs=2, random_seed=0, verbose=0, **kw)
        return core.fit(df, est._config(), est.framework)

    plain = fit()
    doubled = fit(transformation_fn=_double_first)
    steps = -(-(n // 2) // 16)
    for result in (plain, doubled):
        profiles = [e["profile"] for e in result.extra["phases"]["epochs"]]
        assert [p["steps"] for p in profiles] == [steps, steps]
        for p in profiles:
            parts = p["train_step.forward+loss"] + p["train_step.backward"] + p["train_step.optimizer"]
            assert p["batch_wait"] > 0 and 0 < parts <= p["train_step"]
    # the function's change reached the model: the first layer saw 'a' doubled, so the fits differ
    assert plain.history[-1]["loss"] != doubled.history[-1]["loss"]
    again = fit()
    assert again.history[-1]["loss"] == plain.history[-1]["loss"]  # same seed, same rows: the same fit


class _ThreadsNet(torch.nn.Module):
    """An MLP that keeps, in a buffer that comes back with the fitted weights, the torch threads of the
    process its last forward pass ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()
        self.register_buffer("threads", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.threads.fill_(torch.get_num_threads())
        return self.body(x)


def test_each_cpu_rank_uses_its_share_of_the_hosts_cores(reg_pandas, store, monkeypatch):
    import os

    # torch's default (every core in every rank) ran 2 ranks on 2 cores at a third of the speed
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # (the test session sets it to 1)
    monkeypatch.delenv("HORA_RANK_THREADS", raising=False)
    net = _ThreadsNet()
    model = _est(store, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.01), epochs=1,
                 validation=None).fit(reg_pandas)
    assert int(model.model_.threads) == max(1, len(os.sched_getaffinity(0)) // 2)


def test_rank_threads_follow_the_setting_then_omp_num_threads_then_the_cores(monkeypatch):
    from hora.threads import rank_threads

    assert rank_threads(2, {}, cores=16) == 8
    assert rank_threads(3, {}, cores=16) == 5
    assert rank_threads(4, {}, cores=2) == 1  # more ranks than cores: one each
    assert rank_threads(2, {"OMP_NUM_THREADS": "4"}, cores=16) is None  # the user's or the cluster's choice
    assert rank_threads(2, {"OMP_NUM_THREADS": "4", "HORA_RANK_THREADS": "3"}, cores=16) == 3
    assert rank_threads(1, {"HORA_RANK_THREADS": "0"}, cores=2) == 2  # 0: automatic
