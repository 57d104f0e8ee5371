"""A lost Spark executor mid-fit: on a real standalone cluster (master + two workers on
127.0.0.1 and 127.0.0.2, through a Spark Connect server), rank 1 SIGKILLs its own executor JVM
in epoch 1; ``fit(max_failures=1)`` completes on the executor the standalone worker starts in
its place, with each epoch once, and the relaunched rank on that host forks from the warm rank
server the lost executor left (keyed by the application and host: torch is not imported again)."""

from __future__ import annotations

import json
import logging
import os
import re

import pandas as pd
import pytest
import torch

from hora.estimators.callbacks import Callback
from tests.estimators.frames import mlp, regression_data
from tests.estimators.recovery_callbacks import KillRank, WeightsProbe
from tests.runners.helpers import assert_no_workers_left, relaunch_lines

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_a_fit_survives_its_executor_jvm_killed(standalone_connect, tmp_path, caplog):
    import hora.runners as hr
    from hora.spark import TorchEstimator
    from hora.store import Store

    _, spark = standalone_connect
    caplog.set_level(logging.WARNING, logger="hora.runners.driver.recovery")
    x, y = regression_data(n=128)
    df = spark.createDataFrame(pd.DataFrame({"features": [row.tolist() for row in x], "y": y}))
    net = mlp()
    folder = str(tmp_path)

    class Origin(Callback):  # defined here: pickled by value, the ranks need not import this module
        def on_train_begin(self, ctx):
            import psutil

            server = psutil.Process().parent()
            with open(os.path.join(folder, f"origin.{os.environ['HORA_ATTEMPT']}.{ctx.rank}"), "w") as fh:
                json.dump({"host": os.environ.get("SPARK_LOCAL_IP"), "server": server.pid,
                           "cmdline": server.cmdline()[:3], "cwd": os.getcwd()}, fh)

    fit = TorchEstimator(
        # 2 ranks (4 cores, 2 per task): one rank per worker, rank 1's executor is the other host's
        backend=hr.SparkLauncher(spark, task_cpus=2),
        store=Store.create(str(tmp_path / "store")), model=net, optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
        loss=torch.nn.MSELoss(), feature_cols=["features"], label_cols=["y"], batch_size=16, epochs=3,
        random_seed=0, verbose=0, max_failures=1, start_timeout=240, run_id="standalone-fit-kill",
        callbacks=[KillRank(rank=1, epoch=1, step=1, target="executor"), WeightsProbe(str(tmp_path)), Origin()],
    ).fit(df)
    assert [(h["epoch"], h["attempt"], h["num_proc"]) for h in fit.getHistory()] == [(0, 1, 2), (1, 2, 2), (2, 2, 2)]
    assert len({(tmp_path / f"weights.{r}").read_text() for r in range(2)}) == 1
    (line,) = relaunch_lines(caplog)  # one relaunch, naming the lost executor's rank and host
    assert re.search(r"attempt 1 of 2 failed: rank 1 on 127\.0\.0\.[12] was lost: ExecutorLostFailure \(executor ",
                     line), line
    assert "(a host, executor or worker was lost, retriable)" in line, line
    assert_no_workers_left("standalone-fit-kill", within=30)
    origin = {name.split(".", 1)[1]: json.loads((tmp_path / name).read_text())
              for name in os.listdir(tmp_path) if name.startswith("origin.")}
    lost = origin["1.1"]  # rank 1 of attempt 1 killed its executor
    (after,) = [o for key, o in origin.items() if key.startswith("2.") and o["host"] == lost["host"]]
    assert lost["cmdline"][1:] == ["-m", "hora.runners.rank.warm.server"], lost  # a warm rank
    assert after["server"] == lost["server"], (lost, after)  # the same server, in the new executor's folder
    assert after["cwd"] != lost["cwd"], (lost, after)
