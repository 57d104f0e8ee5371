"""examples/spark_text_tokens.py, spark_image_png.py and spark_sparse_hashed.py (issue 26 item 4) and
spark_text_fsdp.py (issue 28 item 4) run end to end on small data and reach their held-out metric
(MLlib's evaluators; the FSDP example's held-out loss against its data's entropies): each returns
non-zero below it.

The four run one after another in ONE child process, each as ``main(argv)`` with its own Spark
local[2] session (each example starts its session and stops it, as a notebook user running them in
turn would), so that the interpreter, torch, pyspark and the py4j gateway's JVM start once, not four
times; every example still reports on its own (its return code and what it printed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1500)]  # the first test pays for all four

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

CASES = [
    ("spark_text_tokens.py", ["--rows", "1500", "--epochs", "3"]),
    ("spark_image_png.py", ["--epochs", "5"]),
    ("spark_sparse_hashed.py", ["--rows", "1500", "--epochs", "3"]),
    ("spark_text_fsdp.py", ["--rows", "1500", "--epochs", "3"]),  # issue 28 item 4: strategy="fsdp" on Spark
]

# Runs each example's main(argv) in turn; writes {script: {"rc": ..., "stdout": ...}} after each one, so a
# crash of the process leaves the results so far (and the test of the crashed example says so).
RUNNER = textwrap.dedent('''
    import contextlib, importlib.util, io, json, sys, traceback

    cases, out_path = json.loads(sys.argv[1]), sys.argv[2]
    results = {}
    for i, (path, argv) in enumerate(cases):
        buf = io.StringIO()
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
        except SystemExit as exc:
            rc = exc.code
        except BaseException:
            rc = "raised"
            buf.write(traceback.format_exc())
        results[path] = {"rc": rc, "stdout": buf.getvalue()}
        print(f"{path}: {rc}", file=sys.stderr, flush=True)
        with open(out_path, "w") as fh:
            json.dump(results, fh)
''')


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("column-type-examples")
    cases = [(str(EXAMPLES / script), [*args, "--store", str(tmp / f"store-{i}")])
             for i, (script, args) in enumerate(CASES)]
    (tmp / "runner.py").write_text(RUNNER)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
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
