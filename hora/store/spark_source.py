"""Materialize a Spark DataFrame, classic or Spark Connect, through the DataFrame API only.

* Fingerprint: ``DataFrame.semanticHash()`` (the analyzed plan), ``inputFiles()`` and the
  schema: no JVM call, so it works on a Connect client.
* Writing: ``mapInArrow`` runs hora's Parquet writer inside the tasks (one pass, no sort;
  a shuffle only when a classic frame has fewer partitions than ``num_proc``: Connect
  cannot tell the partition count without a job, so there the driver re-cuts the few
  files instead). ``memory://`` stores live in one process: the rows are collected to
  the client (``toArrow``) and written there.
* Before writing, one tiny task checks that the executors reach the store and see the
  same files as the driver (:func:`check_executors_reach`), so a store URL that only the
  driver can use fails at once with its URL in the message.
* Jobs carry the tag ``hora-materialize-<attempt>``; on classic sessions also a
  description (``hora: materialize <fingerprint> ...``).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import uuid
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from hora import _spark
from hora.errors import DataError, StoreError
from hora.store import retry
from hora.store.layout import join
from hora.store.sources import Source, missing_columns, probe_answer_error, remove_probe, stored_kinds
from hora.store.store import ENV_STORE_TIMEOUT, Store, store_timeout
from hora.store.writer import WritePlan, write_part

logger = logging.getLogger(__name__)

_SPARK_SCALARS = ("ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType", "BooleanType")
PROBE_PREFIX = "_hora_executor_check-"


def _write_partition(plan: WritePlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One Spark task of a materialization: write its partition, yield its stats as one row."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    part = ctx.partitionId() if ctx else 0
    attempt = ctx.attemptNumber() if ctx else 0
    stats = write_part(plan, part, batches, suffix=f"-a{attempt}" if attempt else "")
    yield pa.RecordBatch.from_pydict({"stats": [json.dumps(stats)]})


class SparkSource(Source):
    """A ``pyspark.sql.DataFrame`` of a classic or a Spark Connect session."""

    kind = "spark"
    description = "a Spark DataFrame"
    launcher = "spark"
    compresses_sparse = True

    def __init__(self, df: Any, vector_dtype: str = "float32", compress_sparse: bool = False) -> None:
        self.df = df
        self.vector_dtype = vector_dtype
        #: ML vector columns go to the store as indices + values (``compress_sparse_cols``)
        self.compress_sparse = compress_sparse
        self.kinds: dict[str, str] = {}

    @property
    def frame(self) -> Any:
        return self.df

    def columns(self) -> list[str]:
        return [str(c) for c in self.df.columns]

    def head(self, columns, rows):
        return self.df.select(*[f"`{c}`" for c in columns]).limit(rows).toPandas()

    def string_columns(self, columns):
        types = dict(self.df.dtypes)
        return [c for c in columns if types.get(c) == "string"]

    def with_options(self, vector_dtype, compress_sparse):
        if (vector_dtype, compress_sparse) == (self.vector_dtype, self.compress_sparse):
            return self
        return SparkSource(self.df, vector_dtype, compress_sparse)

    @staticmethod
    def _type_kind(dt: Any) -> str | None:
        from pyspark.sql import types as T

        name = type(dt).__name__
        if name == "VectorUDT":
            return "vector"
        if name in _SPARK_SCALARS:
            return "scalar"
        if isinstance(dt, T.BinaryType):
            return "binary"
        if isinstance(dt, T.StringType):
            return "string"
        if isinstance(dt, T.ArrayType):
            inner = SparkSource._type_kind(dt.elementType)
            return "array" if inner in ("scalar", "array") else None
        return None

    def check_schema(self, stored, label_cols, weight, val_col):
        fields = {f.name: f for f in self.df.schema.fields}
        all_cols = stored + ([val_col] if val_col else [])
        missing_columns(all_cols, list(fields))
        kinds = {}
        for c in all_cols:
            dt = fields[c].dataType
            kinds[c] = self._type_kind(dt)
            if kinds[c] is None:
                raise DataError(
                    f"column {c!r} has Spark type {dt.simpleString()}; hora can feed numeric/boolean "
                    "scalars, ML vectors, arrays of numbers (fixed or variable length), binary and string "
                    "columns to a model (index or encode it first)"
                )
        self.kinds = stored_kinds(kinds, val_col, weight)

    @property
    def sparse_cols(self) -> tuple[str, ...]:
        """The vector columns stored sparse (all of them with ``compress_sparse_cols``)."""
        return tuple(c for c, k in self.kinds.items() if k == "vector") if self.compress_sparse else ()

    def data_token(self, cols):
        df = self.df
        try:
            plan_hash = str(df.semanticHash())
        except Exception as exc:
            raise DataError(f"cannot fingerprint this Spark DataFrame (semanticHash failed: {exc})") from exc
        try:
            files = sorted(df.inputFiles())
        except Exception:  # pragma: no cover - plans without a file index
            files = []
        return json.dumps({"plan": plan_hash, "files": files, "schema": df.schema.json(), "cols": cols})

    def _select(self, plan: WritePlan) -> Any:
        F = _spark.functions(self.df)
        exprs = []
        for c in plan.columns:
            if self.kinds[c] == "vector" and c not in self.sparse_cols:
                exprs.append(_spark.vector_to_array(self.df, F.col(c), self.vector_dtype).alias(c))
            else:
                exprs.append(F.col(c))
        if plan.val_col:
            exprs.append(F.col(plan.val_col))
        return self.df.select(*exprs)

    def write(self, plan, num_proc, describe):
        sel = self._select(plan)
        session = sel.sparkSession
        tag = f"hora-materialize-{plan.attempt}"
        if plan.store.protocol == "memory":
            # memory:// lives in this process only: collect to the driver and write here
            with _spark.job_scope(session, tag, describe + " (collect to driver for memory://)"):
                table = sel.toArrow()
            n = table.num_rows
            bounds = np.linspace(0, n, num_proc + 1).astype(int)
            return [write_part(plan, i, [table.slice(bounds[i], bounds[i + 1] - bounds[i])]) for i in range(num_proc)]
        check_executors_reach(session, plan.store)
        parts = _spark.num_partitions(sel)
        if parts is not None and parts < num_proc:
            sel = sel.repartition(num_proc)
        task = functools.partial(_write_partition, plan)
        task.__name__ = f"hora: materialize {plan.attempt}"  # type: ignore[attr-defined]
        with _spark.job_scope(session, tag, describe):
            rows = sel.mapInArrow(task, "stats string").collect()
        return [json.loads(r["stats"]) for r in rows]


# --------------------------------------------------------------------------------------
# can the executors use the store?
# --------------------------------------------------------------------------------------
def _probe_on_executor(store: Store, path: str, token: str, batches: Iterator[Any]) -> Iterator[Any]:
    """Read the driver's probe file and write an answer next to it; yield the error text ('' if fine)."""
    for _ in batches:
        pass
    timeout = store_timeout()
    outcome: dict[str, str] = {}

    def _check() -> None:
        try:
            with retry.limited(timeout / 3):  # answer with the store's own error within the timeout
                seen = store.read_bytes(path).decode("utf-8", "replace")
            if seen != token:
                outcome["error"] = f"the executor reads different content at {store.url_for(path)}"
                return
            with retry.limited(timeout / 3):
                store.write_bytes(path + ".ack", token.encode())
            outcome["error"] = ""
        except Exception as exc:  # reported to the driver as text
            outcome["error"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=_check, name="hora-store-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if "error" not in outcome:
        outcome["error"] = f"no answer from the store within {timeout:.0f} s (set {ENV_STORE_TIMEOUT} to wait longer)"
    yield pa.RecordBatch.from_pydict({"error": [outcome["error"]]})


_reached_lock = threading.Lock()
_reached: set[tuple[str, str]] = set()  # (session key, store URL) the executors were seen to use


def check_executors_reach(session: Any, store: Store) -> None:
    """Run one tiny Spark task that reads a file the driver wrote to ``store`` and writes one back.

    A store that passed is not checked again on the same session (fit, materialize and
    the launch each ask).

    Raises:
        StoreError: the executors cannot read or write the store, or see other files than the
            driver (e.g. a ``file://`` folder that exists on each host separately); the message
            names the store URL.
        ConfigError: the executors cannot import hora.
    """
    key = (_spark.session_key(session), store.url)
    with _reached_lock:
        if key in _reached:
            return
    token = uuid.uuid4().hex
    path = join(store.root, PROBE_PREFIX + token)
    store.write_bytes(path, token.encode())
    try:
        probe = functools.partial(_probe_on_executor, store, path, token)
        probe.__name__ = "hora: check the store"  # type: ignore[attr-defined]
        frame = session.range(0, 1, 1, numPartitions=1).mapInArrow(probe, "error string")
        try:
            rows = _spark.collect(session, frame, f"hora-store-check-{token[:12]}",
                                  f"hora: check that the executors reach {store.url}",
                                  timeout=max(_spark.PROBE_TIMEOUT, 2 * store_timeout()))
        except TimeoutError as exc:
            raise StoreError(f"could not check that the Spark executors reach the store {store.url}: {exc}") from exc
        except Exception as exc:
            raise _spark.missing_hora(exc) or exc
        error = rows[0]["error"] if rows else "the check task returned nothing"
        if not error:
            error = probe_answer_error(store, path, token, "the executors")
    finally:
        remove_probe(store, path)
    if error:
        raise StoreError(
            f"the Spark executors cannot use the store {store.url}: {error}. Use a store every executor reaches "
            "with the same storage options and sees the same files in (an object store, HDFS, or a folder "
            "shared by every host)"
        )
    with _reached_lock:
        _reached.add(key)


__all__ = ["SparkSource", "check_executors_reach"]
