"""The console of a fit at verbose=1: one header line, one line (off a terminal)
or one bar (on a terminal) per epoch whose last loss is the history's, one summary line;
no per-rank INFO lines and no RuntimeWarning from hora.

On Spark, with Spark's own console progress bar on as in a pyspark shell, the
terminal test's child also runs 1-second stages before the fit: Spark's ``[Stage N:`` bar draws outside
:func:`hora._spark.console_progress_paused` (the control: the test can fail), nothing inside it (also
nested), and draws again after the block ends; then nothing while hora's training stage runs. (This was
tests/estimators/test_spark_console_bar.py, a Spark session of its own in another child process.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch

from tests.estimators.frames import mlp, regression_data

EPOCH_LINE = re.compile(r"^epoch (\d)/3: loss=(\S+) val_loss=(\S+) .*\| [\d.]+ s, \d+ rows/s$")


def _estimator(cls, store):
    net = mlp()
    return cls(num_proc=2, store=store, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
               loss=torch.nn.MSELoss(), feature_cols=["features"], label_cols=["y"], batch_size=32, epochs=3,
               validation=0.25, random_seed=1, verbose=1)


def _check_plain_console(err: str, history: list[dict]) -> None:
    assert "RuntimeWarning" not in err, err
    assert "<stderr>:INFO" not in err and "hora initialized" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith(("hora: ", "epoch "))]
    assert len([ln for ln in lines if ln.startswith("hora: run ") and " on 2 ranks " in ln]) == 1, err
    epochs = [EPOCH_LINE.match(ln) for ln in lines if ln.startswith("epoch ")]
    assert all(epochs) and [int(m.group(1)) for m in epochs] == [1, 2, 3], err
    for m, h in zip(epochs, history):  # the line's values are the epoch's logged values
        assert m.group(2) == f"{round(h['loss'], 6):.4g}" and m.group(3) == f"{round(h['val_loss'], 6):.4g}"
    summary = [ln for ln in lines if " done: 3 epochs" in ln]
    assert len(summary) == 1 and "best val_loss=" in summary[0] and "checkpoints: " in summary[0], err
    assert "TensorBoard logs: " in summary[0]
    assert "\r" not in err.split("hora: run ", 1)[1].split(" done: ", 1)[0]  # no bar off a terminal


@pytest.mark.spark
@pytest.mark.timeout(420)
def test_spark_fit_console_off_a_terminal(spark, store, capfd):
    from hora.spark import TorchEstimator

    x, y = regression_data(n=300)
    df = spark.createDataFrame(pd.DataFrame({"features": [list(map(float, r)) for r in x], "y": y}))
    capfd.readouterr()
    model = _estimator(TorchEstimator, store).fit(df)
    _check_plain_console(capfd.readouterr().err, model.history_)


@pytest.mark.timeout(420)
def test_dask_fit_console_off_a_terminal(dask_client, store, capfd):
    import dask
    import dask.dataframe as dd

    from hora.dask import TorchEstimator

    x, y = regression_data(n=300)
    with dask.config.set({"dataframe.convert-string": False}):
        ddf = dd.from_pandas(pd.DataFrame({"features": list(x), "y": y}), npartitions=4)
    capfd.readouterr()
    model = _estimator(TorchEstimator, store).fit(ddf)
    _check_plain_console(capfd.readouterr().err, model.history_)


SCRIPT = textwrap.dedent("""
    import json, os, sys
    import pandas as pd, torch
    from tests.estimators.frames import mlp, regression_data
    from hora.store import Store

    x, y = regression_data(n=300)
    frame = pd.DataFrame({"features": [list(map(float, r)) for r in x], "y": y})
    if sys.argv[2] == "spark":  # Spark's own console bar on, as in a pyspark shell: quiet while hora trains
        from pyspark.sql import SparkSession
        from hora.spark import TorchEstimator
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "true").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        from hora import _spark

        def slow(batches):
            import time
            for b in batches:
                time.sleep(1.0)
                yield b

        def stage():  # a 1-second stage: Spark draws a stage once it has run 0.5 s, and redraws every 0.2 s
            df = spark.range(0, 2, 1, numPartitions=2)
            df.mapInArrow(slow, df.schema).collect()

        def mark(name):
            print(f"MARK {name}", file=sys.stderr, flush=True)

        stage(); mark("plain")
        with _spark.console_progress_paused(spark):
            stage(); mark("paused")
            with _spark.console_progress_paused(spark):
                stage(); mark("nested")
            stage(); mark("outer")
        stage(); mark("restored")
        frame = spark.createDataFrame(frame)
    elif sys.argv[2] == "dask":  # a Dask frame on a LocalCluster of 2 worker processes
        import dask, dask.dataframe as dd
        from distributed import Client, LocalCluster
        from hora.dask import TorchEstimator
        if __name__ == "__main__":
            client = Client(LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None))
        with dask.config.set({"dataframe.convert-string": False}):
            frame = dd.from_pandas(pd.DataFrame({"features": list(x), "y": y}), npartitions=4)
    else:  # a pandas frame: local ranks
        from hora.dask import TorchEstimator
    net = mlp()
    est = TorchEstimator(num_proc=2, store=Store.create(sys.argv[1]), model=net,
                         optimizer=torch.optim.Adam(net.parameters(), lr=0.01), loss=torch.nn.MSELoss(),
                         feature_cols=["features"], label_cols=["y"], batch_size=32, epochs=3, validation=0.25,
                         random_seed=1, verbose=1)
    if __name__ == "__main__":
        model = est.fit(frame)
        print("HISTORY=" + json.dumps(model.history_), flush=True)
""")


@pytest.mark.timeout(420)
@pytest.mark.parametrize("face", ["dask", pytest.param("spark", marks=pytest.mark.spark)])
def test_fit_console_on_a_terminal_draws_one_bar_per_epoch_ending_with_the_logged_loss(tmp_path, face):
    import pty

    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    controller, terminal = pty.openpty()
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""), "COLUMNS": "120"}
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "store"), face], cwd=root, env=env,
                            stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    chunks = []
    while True:
        try:
            data = os.read(controller, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    os.close(controller)
    out = b"".join(chunks).decode(errors="replace")
    import json

    history = json.loads(out.split("HISTORY=", 1)[1].splitlines()[0])
    assert "RuntimeWarning" not in out and "<stderr>:INFO" not in out, out
    assert out.count("hora: run ") == 2 and " done: 3 epochs" in out, out  # header and summary
    training = out.split("hora: run ", 1)[1].split(" done: 3 epochs", 1)[0]
    assert "[Stage " not in training, training  # no Spark console bar while hora's stage runs
    if face == "spark":  # and none inside _spark.console_progress_paused (also nested), again after it
        sections, current = {}, []
        for line in out.split("hora: run ", 1)[0].replace("\r", "\n").splitlines():
            if line.startswith("MARK "):
                sections[line.split()[1]] = "\n".join(current)
                current = []
            else:
                current.append(line)
        assert list(sections) == ["plain", "paused", "nested", "outer", "restored"], out
        assert "[Stage " in sections["plain"], out  # the control: Spark's bar draws a 1-second stage here
        for name in ("paused", "nested", "outer"):
            assert "[Stage " not in sections[name], (name, out)
        assert "[Stage " in sections["restored"], out
    for h in history:  # each epoch's bar closes at 100% with the epoch's logged loss
        e = h["epoch"] + 1
        frames = [f for f in re.split(r"[\r\n]", out) if f.startswith(f"epoch {e}/3:")]
        assert frames, out
        assert "100%" in frames[-1] and f"loss={round(h['loss'], 6):.4g}," in frames[-1], frames[-1]
        assert "steps/s" in frames[-1] and "rows/s" in frames[-1]


@pytest.mark.timeout(420)
def test_lightning_fit_console_has_no_lightning_info_lines_or_model_summary_at_verbose_1(store, capfd):
    pytest.importorskip("lightning")
    import lightning.pytorch as pl

    from hora.dask import LightningEstimator

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def forward(self, x):
            return self.net(x)

        def _loss(self, batch):
            return torch.nn.functional.mse_loss(self(batch["features"]).squeeze(-1), batch["y"])

        def training_step(self, batch, batch_idx):
            loss = self._loss(batch)
            self.log("loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self._loss(batch))

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

    x, y = regression_data(n=300)
    est = LightningEstimator(num_proc=2, store=store, model=Regressor(), feature_cols=["features"], label_cols=["y"],
                             batch_size=32, epochs=3, validation=0.25, random_seed=1, verbose=1)
    capfd.readouterr()
    model = est.fit(pd.DataFrame({"features": list(x), "y": y}))  # pandas: local ranks
    captured = capfd.readouterr()
    err = captured.err + captured.out
    assert "<stderr>:INFO" not in err and "Trainable params" not in err, err  # Lightning's INFO, its summary
    assert "GPU available" not in err, err
    _check_plain_console(captured.err, model.history_)
