"""Where the rows of a materialization come from: pandas, Dask, (in spark_source) Spark frames and (in
ray_source) Ray Datasets; the engine's source of a frame is chosen in materialize (:func:`make_source`), above
the three modules.

A :class:`Source` checks the schema on the driver (before anything is written),
gives a data token for the fingerprint, and writes a :class:`~hora.store.writer.WritePlan`
with its engine, returning one stats dict per written part.
"""

from __future__ import annotations

import abc
import hashlib
import logging
from typing import Any, Iterable, Sequence

import numpy as np

from hora.errors import DataError, StoreError
from hora.store.writer import WritePlan, pandas_column_kind, write_pandas_part


class Source(abc.ABC):
    """One engine's side of a materialization."""

    kind = "?"

    @abc.abstractmethod
    def check_schema(self, stored: list[str], label_cols: Sequence[str], weight: str | None, val_col: str | None) -> None:
        """Check the columns' presence and types on the driver.

        Raises:
            DataError: a missing column or one hora cannot feed to a model.
        """

    @abc.abstractmethod
    def data_token(self, cols: list[str]) -> str:
        """A string that changes whenever the data of ``cols`` changes (part of the fingerprint)."""

    @abc.abstractmethod
    def write(self, plan: WritePlan, num_proc: int, describe: str) -> list[dict]:
        """Write every partition per ``plan``; return the parts' stats (``describe`` labels the engine's jobs)."""


def probe_answer_error(store: Any, path: str, token: str, who: str) -> str:
    """After a store probe task (it read ``path`` and wrote ``token`` to ``path + '.ack'``):
    '' when the driver sees its answer, else why not (``who`` names the tasks)."""
    try:
        answer = store.read_bytes(path + ".ack").decode("utf-8", "replace")
    except StoreError:
        answer = ""
    return "" if answer == token else f"{who} wrote the answer somewhere the driver does not see (another file system?)"


def remove_probe(store: Any, path: str) -> None:
    """Remove a store probe's files (best effort)."""
    for p in (path, path + ".ack"):
        try:
            store.rm(p)
        except StoreError as exc:  # pragma: no cover - best effort
            logging.getLogger(__name__).debug("could not remove the store probe %s: %s", p, exc)


def missing_columns(cols: Iterable[str], available: Sequence[str]) -> None:
    missing = [c for c in cols if c not in available]
    if missing:
        raise DataError(f"column(s) {missing} not found in the DataFrame; it has {list(available)}")


def check_scalar_role(name: str, kind: str, role: str) -> None:
    if kind != "scalar":
        raise DataError(f"{role} column {name!r} must hold numeric/boolean scalars, not arrays")


def stored_kinds(kinds: dict[str, str], val_col: str | None, weight: str | None) -> dict[str, str]:
    """The kinds of the stored columns, once the validation and weight columns are found to be scalars.

    Raises:
        DataError: the validation or weight column holds arrays.
    """
    stored = {}
    for c, kind in kinds.items():
        if c == val_col:
            check_scalar_role(c, kind, "validation")
        else:
            stored[c] = kind
    if weight:
        check_scalar_role(weight, stored[weight], "sample weight")
    return stored


def check_label_kinds(kinds: dict[str, str], label_cols: Sequence[str]) -> None:
    """Labels are numbers (scalars, arrays or vectors).

    Raises:
        DataError: a label column holds bytes or strings (names it).
    """
    for c in label_cols:
        if kinds.get(c) in ("binary", "string"):
            raise DataError(f"label column {c!r} holds {kinds[c]} values; a label must be numeric "
                            "(index it first, e.g. with StringIndexer)")


class PandasSource(Source):
    kind = "pandas"

    def __init__(self, df: Any) -> None:
        self.df = df
        self.kinds: dict[str, str] = {}

    def check_schema(self, stored, label_cols, weight, val_col):
        all_cols = stored + ([val_col] if val_col else [])
        missing_columns(all_cols, [str(c) for c in self.df.columns])
        if len(self.df) == 0:
            raise DataError("the DataFrame is empty (0 rows)")
        self.kinds = stored_kinds({c: pandas_column_kind(c, self.df[c]) for c in all_cols}, val_col, weight)

    def data_token(self, cols):
        import pandas as pd

        h = hashlib.sha256()
        h.update(str(len(self.df)).encode())
        for c in cols:
            s = self.df[c]
            h.update(f"|{c}|{s.dtype}|".encode())
            if s.dtype == object:
                for v in s.to_numpy():
                    a = np.asarray(v) if v is not None else np.asarray([])
                    h.update(str(a.dtype).encode() + str(a.shape).encode())
                    h.update(np.ascontiguousarray(a).tobytes())
            else:
                h.update(pd.util.hash_pandas_object(s, index=False).to_numpy().tobytes())
        return h.hexdigest()

    def write(self, plan, num_proc, describe):
        n = len(self.df)
        bounds = np.linspace(0, n, num_proc + 1).astype(int)
        cols = list(self.kinds) + ([plan.val_col] if plan.val_col else [])
        kinds = dict(self.kinds)
        if plan.val_col:
            kinds[plan.val_col] = "scalar"
        out = []
        for i in range(num_proc):
            part = self.df.iloc[bounds[i] : bounds[i + 1]][cols]
            out.append(write_pandas_part(plan, i, part, kinds))
        return out


class DaskSource(Source):
    kind = "dask"

    def __init__(self, ddf: Any) -> None:
        self.ddf = ddf
        self.kinds: dict[str, str] = {}

    def check_schema(self, stored, label_cols, weight, val_col):
        all_cols = stored + ([val_col] if val_col else [])
        missing_columns(all_cols, [str(c) for c in self.ddf.columns])
        meta = self.ddf._meta
        objects = [c for c in all_cols if meta[c].dtype == object]
        sample = None
        if objects:
            sample = self.ddf[objects].head(1, npartitions=-1)
        kinds = {
            c: pandas_column_kind(c, sample[c] if (sample is not None and c in objects) else meta[c]) for c in all_cols
        }
        self.kinds = stored_kinds(kinds, val_col, weight)

    def data_token(self, cols):
        from dask.base import tokenize

        return tokenize(self.ddf, cols)

    def write(self, plan, num_proc, describe):
        import dask

        cols = list(self.kinds) + ([plan.val_col] if plan.val_col else [])
        kinds = dict(self.kinds)
        if plan.val_col:
            kinds[plan.val_col] = "scalar"
        ddf = self.ddf[cols]
        if ddf.npartitions < num_proc:
            ddf = ddf.repartition(npartitions=num_proc)
        parts = ddf.to_delayed()
        if plan.store.protocol == "memory":
            # memory:// lives in this process only: bring the partitions here and write locally
            frames = dask.compute(*parts)
            return [write_pandas_part(plan, i, f, kinds) for i, f in enumerate(frames)]
        write = dask.delayed(write_pandas_part, pure=False)
        tasks = [write(plan, i, p, kinds, dask_key_name=f"hora-materialize-{plan.attempt}-{i}") for i, p in enumerate(parts)]
        return list(dask.compute(*tasks))


__all__ = ["Source", "PandasSource", "DaskSource", "missing_columns", "probe_answer_error", "remove_probe", "check_scalar_role", "stored_kinds",
           "check_label_kinds"]
