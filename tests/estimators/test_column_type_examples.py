"""examples/spark_text_tokens.py, spark_image_png.py and spark_sparse_hashed.py and
spark_text_fsdp.py run end to end on small data and reach their held-out metric
(MLlib's evaluators; the FSDP example's held-out loss against its data's entropies): each returns
non-zero below it. examples/spark_keras_digits.py (a Keras CNN, ``hora.spark.KerasEstimator``) scores
its held-out rows on the executors and its saved and loaded model predicts the same.

The five run one after another in ONE child process, each as ``main(argv)``, so that the interpreter,
torch, pyspark and the py4j gateway's JVM start once, not five times; every example still reports on
its own (its return code and what it printed). They also share ONE Spark local[2] session: each
torch example's ``SparkSession.builder...getOrCreate()`` (the four ask for the same master and configs,
only their appName differs) gets the session the first one started, and its ``spark.stop()`` is deferred,
so that Spark's Python workers (which import torch and hora) start once too (4-12 s less for each
example after the first). The Keras example, last, starts a session of its own as before (its Python
workers import TensorFlow; sharing saved it nothing).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1500)]  # the first test pays for all four

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

CASES = [
    ("spark_text_tokens.py", ["--rows", "1500", "--epochs", "2"]),
    ("spark_image_png.py", ["--epochs", "5"]),
    ("spark_sparse_hashed.py", ["--rows", "1500", "--epochs", "2"]),
    ("spark_text_fsdp.py", ["--rows", "1500", "--epochs", "2"]),  # strategy="fsdp" on Spark
]
#: last: it seeds Python's, NumPy's and TensorFlow's global generators (keras.utils.set_random_seed)
KERAS_DIGITS = ("spark_keras_digits.py", ["--num-proc", "2", "--epochs", "2"])

# Runs each example's main(argv) in turn; writes {script: {"rc": ..., "stdout": ...}} after each one, so a
# crash of the process leaves the results so far (and the test of the crashed example says so). "rc" is
# the exit status the example's own process would have had (its __main__ block exits with main()'s int
# result, or 0; SystemExit's code; 1 for an exception).
RUNNER = textwrap.dedent('''
    import contextlib, importlib.util, io, json, sys, time, traceback

    def status(code):
        return 0 if code is None else code if isinstance(code, int) else 1

    from pyspark.sql import SparkSession

    def stop_shared():
        SparkSession.stop = stop
        session = SparkSession.getActiveSession()
        if session is not None:
            session.stop()

    cases, out_path = json.loads(sys.argv[1]), sys.argv[2]
    results = {}
    stop = SparkSession.stop
    SparkSession.stop = lambda self: None  # the shared session: its spark.stop() is stop_shared's
    for i, (path, argv, shared) in enumerate(cases):
        if not shared:
            stop_shared()  # this example and the ones after it: sessions of their own
        buf = io.StringIO()
        t0 = time.monotonic()
        try:
            with contextlib.redirect_stdout(buf):
                spec = importlib.util.spec_from_file_location(f"hora_example_{i}", path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module  # while its classes are made (dataclasses look it up)
                try:
                    spec.loader.exec_module(module)
                finally:
                    del sys.modules[spec.name]  # then unimportable, as __main__ is: pickled by value
                rc = module.main(argv)
            rc = rc if isinstance(rc, int) else 0
        except SystemExit as exc:
            rc = status(exc.code)
            buf.write(f"SystemExit: {exc.code}")
        except BaseException:
            rc = 1
            buf.write(traceback.format_exc())
        results[path] = {"rc": rc, "stdout": buf.getvalue()}
        print(f"{path}: {rc} ({time.monotonic() - t0:.1f} s)", file=sys.stderr, flush=True)
        with open(out_path, "w") as fh:
            json.dump(results, fh)
    stop_shared()
''')


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("column-type-examples")
    cases = [(str(EXAMPLES / script), [*args, "--store", str(tmp / f"store-{i}")], script != KERAS_DIGITS[0])
             for i, (script, args) in enumerate([*CASES, KERAS_DIGITS])]
    (tmp / "runner.py").write_text(RUNNER)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", TF_CPP_MIN_LOG_LEVEL="2",
               OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, str(tmp / "runner.py"), json.dumps(cases), str(tmp / "results.json")],
                         capture_output=True, text=True, timeout=1400, cwd=tmp, env=env)
    results = json.loads((tmp / "results.json").read_text()) if (tmp / "results.json").exists() else {}
    return res, results


@pytest.mark.parametrize("script,args", CASES)
def test_example_runs_and_reaches_its_metric(script, args, example_runs):
    proc, results = example_runs
    got = results.get(str(EXAMPLES / script))
    assert got is not None, f"the runner ended ({proc.returncode}) before {script}:\n{proc.stderr[-5000:]}"
    assert got["rc"] == 0, got["stdout"][-3000:] + proc.stderr[-3000:]
    assert "held-out" in got["stdout"] and got["stdout"].rstrip().endswith("OK"), got["stdout"]


@pytest.mark.tf
@pytest.mark.slow
def test_spark_keras_digits_example(example_runs):
    if importlib.util.find_spec("keras") is None:  # (not imported here: the example imports it in its process)
        pytest.skip("needs keras (pip install 'hora[tensorflow]')")
    proc, results = example_runs
    got = results.get(str(EXAMPLES / KERAS_DIGITS[0]))
    assert got is not None, f"the runner ended ({proc.returncode}) before {KERAS_DIGITS[0]}:\n{proc.stderr[-5000:]}"
    assert got["rc"] == 0, got["stdout"][-3000:] + proc.stderr[-5000:]
    accuracy = float(re.search(r"test accuracy on \d+ rows \(scored on the executors\): ([0-9.]+)", got["stdout"])[1])
    assert accuracy > 0.7
    assert "the loaded model predicts the same: True" in got["stdout"]
