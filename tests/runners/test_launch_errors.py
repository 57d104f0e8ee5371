"""Errors hora recognises inside a Spark failure are raised without Spark's Java stack and chained
tracebacks in front; the Spark error stays on ``exc.spark_error``."""

from __future__ import annotations

import os
import sys
import traceback
import venv

import numpy as np
import pandas as pd
import pytest

import hora.runners as hr
from hora.errors import ConfigError


def _printed(exc: BaseException) -> str:
    """What Python prints for ``exc`` when nobody catches it."""
    return "".join(traceback.format_exception(exc))


def _assert_unwrapped(exc: BaseException, spark_error: bool = True) -> None:
    assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__), \
        "the Spark error is chained in front"
    printed = _printed(exc)
    for java in ("org.apache.spark", "py4j", "Py4JJavaError", "During handling of the above exception",
                 "The above exception was the direct cause"):
        assert java not in printed, f"{java!r} printed in front of the hora error:\n{printed}"
    if spark_error:
        kept = getattr(exc, "spark_error", None)
        assert isinstance(kept, Exception) and kept is not exc


def _fail_rank1():
    import hora.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank 1 fails on purpose")
    return 0


@pytest.mark.spark
@pytest.mark.timeout(240)
def test_a_failed_rank_in_a_spark_stage_is_raised_without_the_java_stack(spark):
    from hora.errors import WorkerFailedError

    with pytest.raises(WorkerFailedError, match="rank 1 fails on purpose") as info:
        hr.run(_fail_rank1, num_proc=2, backend="spark", spark=spark, run_id="unwrap-rank", verbose=0,
               start_timeout=120)
    _assert_unwrapped(info.value, spark_error=False)
    assert info.value.rank == 1


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_pyspark_python_without_hora_is_raised_without_the_java_stack(spark, tmp_path):
    torch = pytest.importorskip("torch")
    from hora.spark import TorchEstimator
    from hora.store import Store

    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(bare)
    df = spark.createDataFrame(pd.DataFrame({"x": np.arange(16, dtype="float64"), "y": np.ones(16)}))
    net = torch.nn.Linear(1, 1)
    est = TorchEstimator(num_proc=2, store=Store.create(str(tmp_path / "store")), model=net, loss=torch.nn.MSELoss(),
                         optimizer=torch.optim.SGD(net.parameters(), lr=0.1), feature_cols=["x"], label_cols=["y"],
                         input_shapes=[[-1, 1]])
    sc = spark.sparkContext
    saved = sc.pythonExec
    sc.pythonExec = str(bare / "bin" / "python")  # what PYSPARK_PYTHON names when the session starts
    try:
        with pytest.raises(ConfigError, match="PYSPARK_PYTHON") as info:
            est.fit(df)
    finally:
        sc.pythonExec = saved
    _assert_unwrapped(info.value)
    text = str(info.value)  # names both interpreters and what the workers' one lacks
    assert str(bare / "bin" / "python") in text and sys.executable in text and "pyarrow" in text, text
    assert len(_printed(info.value).splitlines()) < 40


@pytest.mark.timeout(60)
def test_healthy_dask_workers_pass_the_import_check(dask_client):
    from hora.runners.launchers.dask import check_workers_import_hora

    check_workers_import_hora(dask_client, timeout=30)


@pytest.mark.timeout(240)
def test_dask_workers_whose_hora_is_a_namespace_folder_are_named(tmp_path, monkeypatch):
    """Workers started by a script next to a folder named hora (the README's file:///tmp/hora store)."""
    distributed = pytest.importorskip("distributed")
    from hora.runners.launchers.dask import check_workers_import_hora

    (tmp_path / "hora").mkdir()
    # the script's directory first, as the spawned workers inherit it; hora itself only through its installed
    # finder (as outside the checkout: pytest puts the checkout on sys.path)
    monkeypatch.setattr(sys, "path", [str(tmp_path)] + [
        p for p in sys.path if not os.path.isfile(os.path.join(p or os.getcwd(), "hora", "__init__.py"))])
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                                  host="127.0.0.1") as cluster, distributed.Client(cluster) as client:
        with pytest.raises(ConfigError) as info:
            check_workers_import_hora(client, timeout=60)
    text = str(info.value)
    assert "namespace package" in text and str(tmp_path / "hora") in text and "worker tcp://127.0.0.1" in text


@pytest.mark.timeout(60)
def test_the_executor_probe_names_a_namespace_hora_folder(tmp_path):
    """The probe explain_worker_failure runs on a Spark executor, in a fresh python whose sys.path
    has a folder named hora ahead of the package."""
    import json
    import subprocess

    from hora.estimators.driver.spark_python import _PROBE_SOURCE

    (tmp_path / "hora").mkdir()
    code = ("import json, sys\n"
            f"sys.path = [{str(tmp_path)!r}] + [p for p in sys.path if p]\n"
            "ns = {'__name__': 'probe', 'MODULES': ('json', 'hora')}\n"
            "exec(sys.argv[1], ns)\n"
            "print(ns['probe'](0))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code, _PROBE_SOURCE], cwd=str(tmp_path), env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    missing = json.loads(out.stdout.strip().splitlines()[-1])["missing"]
    assert len(missing) == 1 and missing[0].startswith("hora (") and str(tmp_path / "hora") in missing[0]
    assert "namespace package" in missing[0]
