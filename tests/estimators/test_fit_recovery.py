"""fit(max_failures=...): a rank SIGKILLed mid-epoch does not lose the fit, on local processes,
Spark local[2] and a Dask LocalCluster; checkpoint_every, the history's attempts and sizes,
and a checkpoint of another model."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from hora.errors import ConfigError, WorkerFailedError
from tests.estimators.frames import mlp, regression_columns, regression_frame
from tests.estimators.recovery_callbacks import KillRank, WeightsProbe
from tests.runners.helpers import assert_no_workers_left

EPOCHS = 4


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


def _state(fitted) -> dict[str, np.ndarray]:
    """The trained torch model's parameters and buffers (a Dask model's ``model_``, a Spark one's ``getModel()``)."""
    model = fitted.model_ if hasattr(fitted, "model_") else fitted.getModel()
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _assert_same_training(got, baseline) -> None:
    """A run resumed after a fault trains exactly what the run without it trained (the same
    batches after the same checkpoint), so its weights and metrics match."""
    assert [h["epoch"] for h in got.history_] == list(range(EPOCHS))
    for mine, theirs in zip(got.history_, baseline.history_):
        assert mine["val_loss"] == pytest.approx(theirs["val_loss"], rel=1e-5, abs=1e-7)
    mine = _state(got)
    for name, value in _state(baseline).items():
        np.testing.assert_allclose(mine[name], value, rtol=1e-5, atol=1e-6)


def _recovery_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hora.runners.driver.recovery"]


@pytest.mark.timeout(600)
def test_local_fit_survives_a_rank_killed_mid_epoch_and_resumes_mid_epoch(store, tmp_path, caplog):
    """Rank 1 killed in epoch 2 (a checkpoint per epoch: epoch 2 is trained again), then rank 0
    killed in epoch 1 of a fit that checkpoints every step (one batch lost): both train what
    the fit without a fault trained."""
    from hora.dask import TorchEstimator

    caplog.set_level(logging.WARNING, logger="hora.runners.driver.recovery")
    caplog.set_level(logging.DEBUG, logger="hora.runners.output")  # the ranks' output lines, as the driver gets them
    df = regression_frame()
    for sub in ("base", "steps"):
        (tmp_path / sub).mkdir()
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

    caplog.clear()
    fit = _est(TorchEstimator, store, tmp_path / "steps", [KillRank(rank=0, epoch=1, step=4)], max_failures=1,
               checkpoint_every="1 step", run_id="steps-kill").fit(df)
    _assert_same_training(fit, baseline)  # checkpoints after every step change nothing in the training either
    assert len(_weights_of_every_rank(tmp_path / "steps", 2)) == 1
    resumed = [r.getMessage() for r in caplog.records if "resumed at epoch" in r.getMessage()]
    # a checkpoint after every step: the kill after step 4 of epoch 1 lost that one batch, and attempt 2
    # resumed at (1-based) epoch 2 with 4 batches done
    assert resumed and "attempt 2, resumed at epoch 2 step 4 on 2 rank(s)" in resumed[-1], resumed
    assert [h["attempt"] for h in fit.history_] == [1, 2, 2, 2]
    assert_no_workers_left("steps-kill")


@pytest.mark.timeout(300)
def test_user_errors_and_bad_params_fail_at_once_and_a_fault_that_keeps_happening_ends(store, tmp_path):
    import os

    from hora.dask import TorchEstimator

    slots = os.cpu_count() or 1
    for kw, match in (({"max_failures": -1}, "max_failures must be an integer >= 0"),
                      ({"num_proc": (3, 2)}, "num_proc bounds: min 3 is greater than max 2"),
                      ({"num_proc": (1, 2, 3)}, r"num_proc must be an int or \(min, max\)"),
                      ({"num_proc": (slots + 1, slots + 2)},
                       f"min_num_proc={slots + 1}, but the local launcher has {slots} slot\\(s\\) now"),
                      ({"checkpoint_every": "often"}, "checkpoint_every must be a number of epochs >= 1 or 'N steps'"),
                      ({"checkpoint_every": 0}, "checkpoint_every must be")):
        with pytest.raises(ConfigError, match=match):
            _est(TorchEstimator, store, tmp_path, **kw).fit(regression_frame(64))
    assert not list((tmp_path / "store").rglob("*.parquet"))  # refused before the data was materialized

    class Boom(KillRank):
        def on_batch_end(self, ctx, step, logs):
            raise ValueError("a bug in the training code")

    with pytest.raises(WorkerFailedError, match="ValueError: a bug in the training code") as info:
        _est(TorchEstimator, store, tmp_path, [Boom(0, 0, 0)], max_failures=3).fit(regression_frame(64))
    assert not hasattr(info.value, "attempts")

    # rank 1 is killed in every attempt: exactly max_failures relaunches, then one error naming each attempt
    with pytest.raises(WorkerFailedError) as info:
        _est(TorchEstimator, store, tmp_path, [KillRank(rank=1, epoch=0, step=1, attempt=None)], max_failures=1,
             run_id="always-killed").fit(regression_frame(64))
    lines = str(info.value).splitlines()
    assert lines[0].startswith("run always-killed: 2 attempts failed (max_failures=1); the last: rank 1 on "
                               "127.0.0.1 failed with signal 9 (SIGKILL)"), lines
    assert [a.attempt for a in info.value.attempts] == [1, 2]
    assert [ln.strip().split(":")[0] for ln in lines[1:3]] == ["attempt 1 (2 ranks)", "attempt 2 (2 ranks)"], lines
    assert all("rank 1 on 127.0.0.1 failed with signal 9 (SIGKILL)" in ln for ln in lines[1:3]), lines
    assert_no_workers_left("always-killed")


@pytest.mark.timeout(300)
def test_resuming_a_checkpoint_of_another_model_names_the_first_mismatch(store, tmp_path):
    from hora.dask import TorchEstimator

    _est(TorchEstimator, store, tmp_path, run_id="other-model", epochs=1).fit(regression_frame(64))
    wider = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    with pytest.raises(ConfigError, match=r"belongs to another model: '0.weight' has shape \(16, 4\) in the "
                                          r"checkpoint and \(32, 4\) in the model"):
        _est(TorchEstimator, store, tmp_path, run_id="other-model", model=wider,
             optimizer=torch.optim.Adam(wider.parameters())).fit(regression_frame(64))


# -- engines ---------------------------------------------------------------------------------------------------
def _spark_frame(spark):
    from pyspark.ml.feature import VectorAssembler

    return VectorAssembler(inputCols=list("abcd"), outputCol="features").transform(
        spark.createDataFrame(regression_columns()))


def _dask_frame():
    import dask
    import dask.dataframe as dd

    with dask.config.set({"dataframe.convert-string": False}):  # keep the array column as objects
        return dd.from_pandas(regression_frame(), npartitions=4)


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_spark_fit_survives_a_rank_killed_mid_epoch(spark, store, tmp_path, caplog):
    from hora.spark import TorchEstimator

    caplog.set_level(logging.WARNING, logger="hora.runners.driver.recovery")
    df = _spark_frame(spark)
    (tmp_path / "base").mkdir()
    baseline = _est(TorchEstimator, store, tmp_path / "base", run_id="spark-base").fit(df)
    fit = _est(TorchEstimator, store, tmp_path, [KillRank(rank=1, epoch=2, step=2)], max_failures=2,
               run_id="spark-kill").fit(df)
    assert [h["attempt"] for h in fit.getHistory()] == [1, 1, 2, 2]
    _assert_same_training(fit, baseline)
    assert len(_weights_of_every_rank(tmp_path, 2)) == 1
    assert any("attempt 1 of 3 failed: rank 1 on 127.0.0.1 failed with signal 9 (SIGKILL)" in ln
               for ln in _recovery_lines(caplog))
    assert_no_workers_left("spark-kill")


@pytest.mark.dask
@pytest.mark.timeout(900)
def test_dask_fit_survives_a_rank_killed_mid_epoch(dask_client, store, tmp_path, caplog):
    from hora.dask import TorchEstimator

    caplog.set_level(logging.WARNING, logger="hora.runners.driver.recovery")
    dask_client.wait_for_workers(2, timeout=120)
    ddf = _dask_frame()
    (tmp_path / "base").mkdir()
    baseline = _est(TorchEstimator, store, tmp_path / "base", run_id="dask-base").fit(ddf)
    fit = _est(TorchEstimator, store, tmp_path, [KillRank(rank=1, epoch=1, step=2)], max_failures=2,
               run_id="dask-kill").fit(ddf)
    assert [h["attempt"] for h in fit.history_] == [1, 2, 2, 2]
    _assert_same_training(fit, baseline)
    assert len(_weights_of_every_rank(tmp_path, 2)) == 1
    assert_no_workers_left("dask-kill", within=20)


def _two_dask_workers(client) -> None:
    """Bring the test cluster back to two workers (a retired worker stays in the LocalCluster's
    spec under its name, so scale(2) alone would start none)."""
    import uuid

    cluster = client.cluster
    alive = {w["name"] for w in client.scheduler_info(n_workers=-1)["workers"].values()}
    for name in [n for n in cluster.worker_spec if n not in alive]:
        del cluster.worker_spec[name]
    while len(cluster.worker_spec) < 2:  # a new name: scale() would reuse the retired one's and start nothing
        cluster.worker_spec[f"added-{uuid.uuid4().hex[:8]}"] = cluster.new_spec
    cluster.scale(2)
    client.wait_for_workers(2, timeout=120)


def _dask_worker_of(client, pid: int) -> str:
    import os

    return next(addr for addr, p in client.run(os.getpid).items() if p == pid)


@pytest.mark.dask
@pytest.mark.timeout(900)
@pytest.mark.parametrize("strategy", ["hora", "zero2"])
def test_dask_fit_shrinks_to_the_workers_left_and_grows_back(dask_client, store, tmp_path, caplog, strategy):
    """num_proc=(1, 2): a retired worker's rank is relaunched on the one worker left; with a
    worker added back, the next relaunch (after a second fault) trains on two again. Under
    strategy='zero2' the optimizer's shards written at 2 ranks are resharded to 1, and back."""
    import os
    import signal
    import threading
    import time

    from hora.dask import TorchEstimator

    caplog.set_level(logging.WARNING, logger="hora.runners.driver.recovery")
    dask_client.wait_for_workers(2, timeout=120)
    marks = tmp_path / "marks"
    marks.mkdir()
    done = threading.Event()
    actions: list[str] = []

    def operator() -> None:  # what an operator (or an autoscaler) does while the fit runs
        deadline = time.monotonic() + 600
        while not done.is_set() and time.monotonic() < deadline:
            for attempt in (1, 2):
                mark = marks / f"leaving.{attempt}"
                if mark.exists() and f"acted {attempt}" not in actions:
                    rank_pid, worker_pid = (int(x) for x in mark.read_text().split())
                    if attempt == 1:
                        dask_client.retire_workers(workers=[_dask_worker_of(dask_client, worker_pid)])
                    else:
                        _two_dask_workers(dask_client)
                        os.kill(rank_pid, signal.SIGKILL)
                    actions.append(f"acted {attempt}")
            time.sleep(0.2)

    thread = threading.Thread(target=operator, daemon=True)
    thread.start()
    try:
        fit = _est(TorchEstimator, store, tmp_path, [KillRank(rank=1, epoch=0, step=2, mark_dir=str(marks)),
                                                     KillRank(rank=0, epoch=2, step=1, attempt=2, mark_dir=str(marks))],
                   num_proc=(1, 2), max_failures=2, run_id="dask-elastic", strategy=strategy).fit(_dask_frame())
    finally:
        done.set()
        thread.join(timeout=30)
        _two_dask_workers(dask_client)
    assert actions == ["acted 1", "acted 2"]
    assert [(h["epoch"], h["attempt"], h["num_proc"]) for h in fit.history_] == [
        (0, 2, 1), (1, 2, 1), (2, 3, 2), (3, 3, 2)]
    assert len(_weights_of_every_rank(tmp_path, 2)) == 1  # both ranks of attempt 3 ended with the same weights
    lines = _recovery_lines(caplog)
    assert any("attempt 1 of 3 failed: rank 1 on 127.0.0.1 was lost: Dask worker" in ln for ln in lines), lines
    assert any("relaunching 1 rank(s) on dask (attempt 2 of 3)" in ln for ln in lines), lines
    assert any("relaunching 2 rank(s) on dask (attempt 3 of 3)" in ln for ln in lines), lines
    assert_no_workers_left("dask-elastic", within=20)
