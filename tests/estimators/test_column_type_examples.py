"""examples/spark_text_tokens.py, spark_image_png.py and spark_sparse_hashed.py (issue 26 item 4) and
spark_text_fsdp.py (issue 28 item 4) run end to end on small data, each in its own process with its own
Spark local[2], and reach their held-out metric (MLlib's evaluators; the FSDP example's held-out loss
against its data's entropies): each exits non-zero below it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("script,args", [
    ("spark_text_tokens.py", ["--rows", "1500", "--epochs", "3"]),
    ("spark_image_png.py", ["--epochs", "5"]),
    ("spark_sparse_hashed.py", ["--rows", "1500", "--epochs", "3"]),
    ("spark_text_fsdp.py", ["--rows", "1500", "--epochs", "3"]),  # issue 28 item 4: strategy="fsdp" on Spark
])
def test_example_runs_and_reaches_its_metric(script, args, tmp_path):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    res = subprocess.run([sys.executable, str(EXAMPLES / script), *args, "--store", str(tmp_path / "store")],
                         capture_output=True, text=True, timeout=840, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "held-out" in res.stdout and res.stdout.rstrip().endswith("OK"), res.stdout
