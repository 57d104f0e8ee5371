"""``data_wait``: the part of each epoch a rank's training step waited for its next batch.

The clock (:class:`hora.estimators.worker.feed.DataWait`) on a fake clock; then two real fits on
local ranks: a ``decode_fn`` that sleeps (the step waits nearly all the time: the history,
the callbacks' logs, the summary line and the warning say so) and a small in-memory frame
under a step that takes longer than reading (nearly no wait).
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
import torch

from hora.estimators.worker import feed
from hora.estimators.callbacks import Callback
from tests.estimators.frames import regression_data

pytestmark = pytest.mark.timeout(300)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_clock_counts_the_waits_in_next_and_the_gaps(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(feed.time, "perf_counter", clock)

    def batches():  # each batch takes 1 s to come
        for i in range(3):
            clock.now += 1.0
            yield i

    wait = feed.DataWait()
    for _ in wait.timed(batches(), epoch=0):
        clock.now += 3.0  # the step
        wait.step_ends()
    assert wait.batches == 3 and wait.waited == pytest.approx(3.0) and wait.first == pytest.approx(1.0)
    assert wait.fraction() == pytest.approx(3.0 / 12.0)
    for _ in wait.timed(iter([]), epoch=0):  # the same epoch goes on counting (a second pass)
        pass
    assert wait.fraction() == pytest.approx(3.0 / 12.0)
    # gap mode (a framework reading its own data): the time between steps is the wait
    wait.epoch_starts(1)
    assert wait.fraction() == 0.0
    for _ in range(2):
        clock.now += 2.0
        wait.step_begins()
        clock.now += 2.0
        wait.step_ends()
    assert wait.fraction() == pytest.approx(0.5) and wait.batches == 2


def test_advice_names_the_rank_the_cause_and_the_knobs():
    text = feed.advice([0.1, 0.7], epoch=0, decoding=["img"], cached=False, batch_size=8, use_gpu=False)
    assert text.startswith("rank 1 waited for its next batch 70% of epoch 1")
    for knob in ("decode_fn", "'img'", "inmemory_cache_all=True", "HORA_RANK_THREADS", "batch_size (now 8)"):
        assert knob in text, knob
    cached = feed.advice([0.3], epoch=2, decoding=[], cached=True, batch_size=64, use_gpu=True, transforming=True)
    assert "inmemory_cache_all" not in cached and "decode_fn" not in cached and "transformation_fn" in cached
    note = feed.summary_note([{"epoch": 0, "ranks": [0.2, 0.9]}, {"epoch": 1, "ranks": [0.31, 0.62]}])
    assert note == "; data_wait max 0.90 (rank 1, epoch 1), last epoch by rank: 0.31, 0.62"
    assert feed.summary_note(None) == ""


class LogsSeen(Callback):
    """Writes the epoch logs rank 0's callbacks got (what MLflowLogger logs) into the store."""

    def on_epoch_end(self, ctx, epoch, logs):
        if ctx.rank == 0:
            ctx.store.write_json(f"{ctx.store.layout.run_dir(ctx.run_id)}/logs-{epoch}.json", logs)


def _slow_decode(data: bytes) -> np.ndarray:
    time.sleep(0.02)
    return np.frombuffer(data, dtype=np.float32)


def _fit(store, frame, run_id, **kw):
    from hora.dask import TorchEstimator

    torch.manual_seed(0)
    net = kw.pop("model", None) or torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    return TorchEstimator(store=store, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.01),
                          loss=torch.nn.MSELoss(), label_cols=["y"], random_seed=0, run_id=run_id,
                          callbacks=[LogsSeen()], **kw).fit(frame)


def test_a_slow_decode_fn_makes_the_step_wait(store, capfd):
    x, y = regression_data(n=32)
    frame = pd.DataFrame({"img": [r.tobytes() for r in x], "y": y})
    capfd.readouterr()
    model = _fit(store, frame, "slow-decode", num_proc=2, feature_cols=["img"], decode_fn={"img": _slow_decode},
                 batch_size=8, epochs=2, verbose=1)
    err = capfd.readouterr().err
    waits = [h["data_wait"] for h in model.history_]
    assert len(waits) == 2 and all(w > 0.5 for w in waits), model.history_
    assert store.read_json(f"{store.layout.run_dir('slow-decode')}/logs-1.json")["data_wait"] == waits[1]
    summary = [ln for ln in err.splitlines() if " done: 2 epochs" in ln]
    assert len(summary) == 1 and "; data_wait max " in summary[0] and "last epoch by rank: " in summary[0], err
    per_rank = [float(v) for v in summary[0].split("last epoch by rank: ")[1].split(", ")]
    assert len(per_rank) == 2 and max(per_rank) == pytest.approx(waits[1], abs=0.006)
    assert err.count("waited for its next batch") == 1, err  # one warning per fit
    assert "decoding 'img'" in err and "inmemory_cache_all=True" in err


class SlowStep(torch.nn.Module):
    """A regression net whose forward pass takes 30 ms: far longer than reading a batch of a small frame."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def forward(self, x):
        time.sleep(0.03)
        return self.net(x)


def test_a_small_in_memory_frame_keeps_the_step_fed(store, reg_pandas):
    model = _fit(store, reg_pandas, "fed", num_proc=1, feature_cols=["features"], model=SlowStep(),
                 batch_size=16, epochs=2, verbose=0, inmemory_cache_all=True)
    waits = [h["data_wait"] for h in model.history_]
    # the first epoch also waits for the reader's start (its plan, the file's first row group)
    assert len(waits) == 2 and 0.0 <= waits[0] < 0.5 and 0.0 <= waits[1] < 0.05, model.history_
