"""Spark's own console progress bar is quiet while hora's training stage runs (issue 25, item 1).

A fresh SparkSession with ``spark.ui.showConsoleProgress=true`` in a child process (the
JVM's stderr is the child's, so the test reads it from a file): a 1.5-second stage (Spark draws
a stage once it has run 0.5 s, and redraws every 0.2 s) draws ``[Stage N:`` outside
:func:`hora._spark.console_progress_paused` (the control: the test can fail), nothing inside it
(also nested), and draws again after the block ends.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    from hora import _spark

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.showConsoleProgress", "true")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def slow(batches):
        import time
        for b in batches:
            time.sleep(1.5)
            yield b

    def stage():
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
    spark.stop()
""")


@pytest.mark.spark
@pytest.mark.timeout(240)
def test_spark_console_bar_is_paused_inside_the_block_and_restored_after(tmp_path):
    script = tmp_path / "bar.py"
    script.write_text(SCRIPT)
    err_path = tmp_path / "err.txt"
    with open(err_path, "w") as err:
        subprocess.run([sys.executable, str(script)], stderr=err, stdout=subprocess.DEVNULL, timeout=200, check=True)
    err_text = err_path.read_text()
    sections, current = {}, []
    for line in err_text.replace("\r", "\n").splitlines():
        if line.startswith("MARK "):
            sections[line.split()[1]] = "\n".join(current)
            current = []
        else:
            current.append(line)
    assert list(sections) == ["plain", "paused", "nested", "outer", "restored"], err_text
    assert "[Stage " in sections["plain"], err_text
    for name in ("paused", "nested", "outer"):
        assert "[Stage " not in sections[name], (name, err_text)
    assert "[Stage " in sections["restored"], err_text
