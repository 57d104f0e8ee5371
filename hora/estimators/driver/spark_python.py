"""Why a Spark task failed, when the reason is the executors' Python: a clear error on the driver.

Spark runs Python tasks with the interpreter named by ``PYSPARK_PYTHON`` (or
``spark.pyspark.python``), ``python3`` from the executors' PATH when unset. A script
started as ``.venv/bin/python`` without the venv on PATH makes Spark start another
Python, and hora's first task fails deep inside Spark with ``No module named
'pyarrow'``. When a fit fails, :func:`explain_worker_failure` runs one tiny probe task
(a plain Python UDF: it needs neither pyarrow nor hora on the executor, and only the
DataFrame API, so it also works on Spark Connect) that reports the executor's
interpreter and which of hora's modules it cannot import; if any, the fit raises a
:class:`~hora.errors.ConfigError` naming ``PYSPARK_PYTHON`` and that interpreter.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

from hora.errors import ConfigError
from hora.runners.driver.faults import with_spark_error

logger = logging.getLogger(__name__)

#: what every hora task imports on an executor (the framework adds its own)
WORKER_MODULES = ("numpy", "pandas", "pyarrow", "cloudpickle", "hora")

# defined from source so cloudpickle ships it by value: the executor needs no hora to run it
_PROBE_SOURCE = '''
def probe(_value):
    import importlib, json, os, sys
    missing = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            missing.append(name + " (" + type(exc).__name__ + ": " + str(exc)[:120] + ")")
            continue
        if getattr(module, "__file__", None) is None and hasattr(module, "__path__"):
            missing.append(name + " (it finds the folder " + ", ".join(dict.fromkeys(module.__path__)) +
                           ", a namespace package: a folder named " + name + " without __init__.py, e.g. a store "
                           "path, in the executor's working directory or sys.path, instead of the package)")
    return json.dumps({"python": sys.executable, "version": sys.version.split()[0], "missing": missing,
                       "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON")})
'''


def probe_worker_python(spark: Any, modules: tuple[str, ...]) -> dict[str, Any]:
    """``{"python", "version", "missing", "PYSPARK_PYTHON"}`` as one Spark task sees them.

    Raises:
        Exception: whatever Spark raises when it cannot run a Python task at all.
    """
    from pyspark.sql import types as T

    from hora import _spark

    F = _spark.functions(spark)
    namespace: dict[str, Any] = {"__name__": "hora_worker_python_probe", "MODULES": tuple(modules)}
    exec(_PROBE_SOURCE, namespace)  # noqa: S102 - our own constant source
    udf = F.udf(namespace["probe"], T.StringType(), useArrow=False)
    row = spark.range(1).select(udf(F.col("id")).alias("probe")).collect()[0]
    return json.loads(row["probe"])


def explain_worker_failure(spark: Any, exc: BaseException, framework: Any = None) -> None:
    """Raise a ConfigError naming ``PYSPARK_PYTHON`` if ``exc`` came from executors whose Python lacks hora's modules.

    Returns quietly when the executors' Python has everything (``exc`` is then the fit's real error).

    Raises:
        ConfigError: the executors' interpreter cannot import a module hora needs (or cannot start).
    """
    modules = WORKER_MODULES + tuple(getattr(framework, "modules", ()) or ())
    from hora import _spark

    configured = os.environ.get("PYSPARK_PYTHON")
    named = (f"this driver has PYSPARK_PYTHON={configured!r}" if configured
             else "PYSPARK_PYTHON is unset: Spark starts 'python3' from the executors' PATH")
    for key in ("spark.pyspark.python", "spark.sql.execution.pyspark.python"):  # the cluster's, the session's
        conf = _spark.conf_get(spark, key)
        if conf:
            named += f", {key}={conf!r}"
    try:
        seen = probe_worker_python(spark, modules)
    except Exception as probe_exc:
        logger.debug("the worker-python probe failed", exc_info=True)
        text = str(probe_exc)
        if "Cannot run program" in text or "No such file" in text or "error=2" in text:
            raise with_spark_error(ConfigError(
                f"Spark cannot start its Python workers ({named}): {text.splitlines()[0][:300]}. Set PYSPARK_PYTHON "
                f"to an interpreter with hora installed, e.g. {sys.executable}, before the SparkSession starts"
            ), exc) from None
        return
    if not seen.get("missing"):
        return
    raise with_spark_error(ConfigError(
        f"Spark's Python workers run {seen['python']} (Python {seen['version']}), which cannot import "
        f"{', '.join(seen['missing'])}; hora's tasks need {', '.join(modules)}. The driver runs {sys.executable}. "
        f"Spark starts the interpreter PYSPARK_PYTHON named when the session started ({named}): set "
        f"PYSPARK_PYTHON={sys.executable} (or spark.pyspark.python) before the SparkSession starts, or install hora "
        f"into {seen['python']}"
    ), exc) from None


__all__ = ["explain_worker_failure", "probe_worker_python", "WORKER_MODULES"]
