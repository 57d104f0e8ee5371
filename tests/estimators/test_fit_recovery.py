"""fit(max_failures=...): a rank SIGKILLed mid-epoch does not lose the fit, on local processes,
Spark local[2] and a Dask LocalCluster; checkpoint_every, the history's attempts and sizes,
and a checkpoint of another model."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
import torch

from hora.errors import ConfigError, WorkerFailedError
from tests.estimators.conftest import mlp, regression_data
from tests.estimators.recovery_callbacks import KillRank, WeightsProbe
from tests.runners.helpers import assert_no_workers_left

EPOCHS = 4


def _frame(n: int = 256) -> pd.DataFrame:
    x, y = regression_data(n=n)
    return pd.DataFrame({"features": list(x), "y": y})


def _est(face, store, tmp_path, callbacks=(), **kw):
    net = mlp()
    args = dict(num_proc=2, store=store, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
                loss=torch.nn.MSELoss(), feature_cols=["features"], label_cols=["y"], batch_size=16,
                epochs=EPOCHS, validation=0.25, random_seed=0, verbose=0,
                callbacks=[*callbacks, WeightsProbe(str(tmp_path))])
    args.update(kw)
    return face(**args)


def _weights_of_every_rank(folder, n: int) -> set[str]:
    return {(folder / f"weights.{r}").read_text() for r in range(n)}


def _state(model) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _assert_same_training(got, baseline) -> None:
    """A run resumed after a fault trains exactly what the run without it trained (the same
    batches after the same checkpoint), so its weights and metrics match."""
    assert [h["epoch"] for h in got.history_] == list(range(EPOCHS))
    for mine, theirs in zip(got.history_, baseline.history_):
        assert mine["val_loss"] == pytest.approx(theirs["val_loss"], rel=1e-5, abs=1e-7)
    for name, value in _state(baseline.model_).items():
        np.testing.assert_allclose(_state(got.model_)[name], value, rtol=1e-5, atol=1e-6)


def _recovery_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hora.runners.recovery"]


@pytest.mark.timeout(600)
def test_local_fit_survives_a_rank_killed_mid_epoch(store, tmp_path, caplog):
    from hora.dask import TorchEstimator

    caplog.set_level(logging.WARNING, logger="hora.runners.recovery")
    df = _frame()
    (tmp_path / "base").mkdir()
    baseline = _est(TorchEstimator, store, tmp_path / "base", run_id="recovery-base").fit(df)
    fit = _est(TorchEstimator, store, tmp_path, [KillRank(rank=1, epoch=2, step=3)], max_failures=2,
               run_id="recovery-local").fit(df)
    assert [(h["attempt"], h["num_proc"]) for h in fit.history_] == [(1, 2), (1, 2), (2, 2), (2, 2)]
    _assert_same_training(fit, baseline)
    assert len(_weights_of_every_rank(tmp_path, 2)) == 1  # every rank ended with the same weights
    lines = _recovery_lines(caplog)
    assert any("attempt 1 of 3 failed: rank 1 on 127.0.0.1 failed with signal 9 (SIGKILL)" in ln for ln in lines)
    assert any("relaunching 2 rank(s) on local (attempt 2 of 3)" in ln for ln in lines)
    assert_no_workers_left("recovery-local")


@pytest.mark.timeout(600)
def test_mid_epoch_checkpoints_bound_the_lost_work(store, tmp_path, caplog):
    from hora.dask import TorchEstimator

    caplog.set_level(logging.DEBUG, logger="hora.runners.output")  # the ranks' output lines, as the driver gets them
    df = _frame()
    (tmp_path / "base").mkdir()
    baseline = _est(TorchEstimator, store, tmp_path / "base", run_id="steps-base", checkpoint_every="1 step").fit(df)
    fit = _est(TorchEstimator, store, tmp_path, [KillRank(rank=0, epoch=1, step=4)], max_failures=1,
               checkpoint_every="1 step", run_id="steps-kill").fit(df)
    _assert_same_training(fit, baseline)
    resumed = [r.getMessage() for r in caplog.records if "resumed at epoch" in r.getMessage()]
    # a checkpoint after every step: the kill after step 4 of epoch 1 lost that one batch, and attempt 2
    # resumed at (1-based) epoch 2 with 4 batches done
    assert resumed and "attempt 2, resumed at epoch 2 step 4 on 2 rank(s)" in resumed[-1], resumed
    assert [(h["attempt"]) for h in fit.history_] == [1, 2, 2, 2]


@pytest.mark.timeout(300)
def test_a_user_error_is_not_retried_and_bad_params_fail_at_once(store, tmp_path):
    from hora.dask import TorchEstimator

    class Boom(KillRank):
        def on_batch_end(self, ctx, step, logs):
            raise ValueError("a bug in the training code")

    with pytest.raises(WorkerFailedError, match="ValueError: a bug in the training code") as info:
        _est(TorchEstimator, store, tmp_path, [Boom(0, 0, 0)], max_failures=3).fit(_frame(64))
    assert not hasattr(info.value, "attempts")
    for kw, match in (({"max_failures": -1}, "max_failures must be an integer >= 0"),
                      ({"num_proc": (3, 2)}, "num_proc bounds: min 3 is greater than max 2"),
                      ({"num_proc": (1, 2, 3)}, r"num_proc must be an int or \(min, max\)"),
                      ({"checkpoint_every": "often"}, "checkpoint_every must be a number of epochs >= 1 or 'N steps'"),
                      ({"checkpoint_every": 0}, "checkpoint_every must be")):
        with pytest.raises(ConfigError, match=match):
            _est(TorchEstimator, store, tmp_path, **kw).fit(_frame(64))


@pytest.mark.timeout(300)
def test_resuming_a_checkpoint_of_another_model_names_the_first_mismatch(store, tmp_path):
    from hora.dask import TorchEstimator

    _est(TorchEstimator, store, tmp_path, run_id="other-model", epochs=1).fit(_frame(64))
    wider = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    with pytest.raises(ConfigError, match=r"belongs to another model: '0.weight' has shape \(16, 4\) in the "
                                          r"checkpoint and \(32, 4\) in the model"):
        _est(TorchEstimator, store, tmp_path, run_id="other-model", model=wider,
             optimizer=torch.optim.Adam(wider.parameters())).fit(_frame(64))
