"""Where the rows of a materialization come from: pandas, Dask, (in spark_source) Spark frames and (in
ray_source) Ray Datasets; the engine's source of a frame is chosen once (:func:`hora.store.materialize.make_source`,
above the three modules) and then used for every engine-dependent step.

A :class:`Source` tells the frame's columns and its first rows on the driver (the
estimators' checks and samples), checks the schema (before anything is written), gives a
data token for the fingerprint, and writes a :class:`~hora.store.writer.WritePlan` with its
engine, returning one stats dict per written part. Its class attributes say what differs by
engine beyond that: the launcher its frames train on by default, and whether
``compress_sparse_cols`` applies.
"""

from __future__ import annotations

import abc
import hashlib
import logging
import warnings
from typing import Any, Iterable, Sequence

import numpy as np

from hora.errors import DataError, StoreError
from hora.store.writer import WritePlan, pandas_column_kind, write_pandas_part


class Source(abc.ABC):
    """One engine's frame, seen on the driver and written to the store.

    Attributes:
        kind: the engine (``"pandas"``, ``"dask"``, ``"spark"``, ``"ray"``), part of a dataset's fingerprint.
        description: the frame's kind in messages (``"a Dask DataFrame"``).
        noun: what messages call the frame (``"DataFrame"``, ``"Ray Dataset"``).
        launcher: the name of the launcher the ranks of a fit on such a frame run on when none is given.
        default_num_proc: the ranks of such a fit when neither ``num_proc`` nor a launcher is given
            (None: as many as the launcher has slots).
        compresses_sparse: whether ``compress_sparse_cols`` applies (frames that hold Spark ML vectors).
    """

    kind = "?"
    description = "a frame"
    noun = "DataFrame"
    launcher = "local"
    default_num_proc: int | None = None
    compresses_sparse = False

    @property
    @abc.abstractmethod
    def frame(self) -> Any:
        """The user's frame (or dataset) this source reads."""

    @abc.abstractmethod
    def columns(self) -> list[str]:
        """The frame's column names.

        Raises:
            DataError: the frame has no schema to tell them (an empty Ray Dataset).
        """

    @abc.abstractmethod
    def head(self, columns: Sequence[str], rows: int) -> Any:
        """The first ``rows`` rows of ``columns`` on the driver: a pandas DataFrame, or one numpy
        array per column (a ``dict``) where the engine gives numpy batches.

        Raises:
            DataError: a frame that cannot tell it is empty until read, found empty.
        """

    def string_columns(self, columns: Sequence[str]) -> list[str]:
        """Which of ``columns`` hold strings (a pandas / Dask dtype: a string dtype, or an object column whose
        first value is a ``str``)."""
        import pandas as pd

        frame = self.frame
        meta = getattr(frame, "_meta", frame)
        out = []
        for c in columns:
            dtype = meta[c].dtype
            if dtype == object:
                first = frame[c].head(1) if meta is frame else frame[c].head(1, npartitions=-1)
                if len(first) and isinstance(first.iloc[0], str):
                    out.append(c)
            elif pd.api.types.is_string_dtype(dtype):
                out.append(c)
        return out

    def for_columns(self, columns: Sequence[str]) -> "Source":
        """The source to read ``columns`` from (this one, unless the engine must rebuild the frame)."""
        return self

    def with_options(self, vector_dtype: str, compress_sparse: bool) -> "Source":
        """The source that writes ML vectors as ``vector_dtype`` (sparse with ``compress_sparse``);
        this one for engines whose frames hold no ML vectors."""
        return self

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
    """A ``pandas.DataFrame``: written in this process; its fits run on local processes (one by default)."""

    kind = "pandas"
    description = "a pandas DataFrame"
    default_num_proc = 1

    def __init__(self, df: Any) -> None:
        self.df = df
        self.kinds: dict[str, str] = {}

    @property
    def frame(self) -> Any:
        return self.df

    def columns(self) -> list[str]:
        return [str(c) for c in self.df.columns]

    def head(self, columns, rows):
        return self.df[list(columns)].head(rows)

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
    """A ``dask.dataframe.DataFrame``: one writer task per partition through the active scheduler."""

    kind = "dask"
    description = "a Dask DataFrame"
    launcher = "dask"

    def __init__(self, ddf: Any) -> None:
        self.ddf = ddf
        self.kinds: dict[str, str] = {}

    @property
    def frame(self) -> Any:
        return self.ddf

    def columns(self) -> list[str]:
        return [str(c) for c in self.ddf.columns]

    def head(self, columns, rows):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "insufficient elements for head" when the first partition is small
            return self.ddf[list(columns)].head(rows, npartitions=min(self.ddf.npartitions, 4))

    def for_columns(self, columns):
        """The frame rebuilt where Dask's string conversion turned array columns into strings (:func:`dask_frame`)."""
        ddf = dask_frame(self.ddf, columns)
        return self if ddf is self.ddf else DaskSource(ddf)

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


# ---------------------------------------------------------------------------------------
# Dask: array columns under the default dataframe.convert-string
# ---------------------------------------------------------------------------------------
def _holds_arrays(series: Any) -> bool:
    first = series.iloc[0] if len(series) else None
    return isinstance(first, (list, tuple, np.ndarray)) or hasattr(first, "toArray")


def dask_frame(ddf: Any, columns: Sequence[str]) -> Any:
    """``ddf`` with ``columns`` as their pandas source holds them (arrays, not strings).

    Dask's ``dataframe.convert-string`` (on by default) makes ``dd.from_pandas`` turn
    object columns into strings, arrays and lists included. Where a wanted column is a
    string column whose ``from_pandas`` source holds arrays, the frame is rebuilt from
    that source without the conversion (the rest of the graph unchanged). Frames from
    other sources are returned as they are.
    """
    import pandas as pd

    meta = ddf._meta
    stringy = [c for c in columns if c in meta.columns and meta[c].dtype != object and pd.api.types.is_string_dtype(meta[c].dtype)]
    expr = getattr(ddf, "expr", None)
    if not stringy or expr is None:
        return ddf
    try:
        from dask.dataframe.dask_expr import new_collection
        from dask.dataframe.dask_expr.io.io import FromPandas
    except ImportError:  # pragma: no cover - an older dask without expressions
        return ddf
    changed = False
    for leaf in list(expr.find_operations(FromPandas)):
        if not leaf.operand("pyarrow_strings_enabled"):
            continue
        frame = leaf.operand("frame")._data
        if any(c in frame.columns and frame[c].dtype == object and _holds_arrays(frame[c]) for c in stringy):
            expr = expr.substitute(leaf, leaf.substitute_parameters({"pyarrow_strings_enabled": False}))
            changed = True
    return new_collection(expr) if changed else ddf


__all__ = ["Source", "PandasSource", "DaskSource", "dask_frame", "missing_columns", "probe_answer_error", "remove_probe", "check_scalar_role", "stored_kinds",
           "check_label_kinds"]
