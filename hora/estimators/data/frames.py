"""The user's DataFrame, seen by the estimators: its engine's Source, which columns, feature groups, samples.

Feature inputs
--------------
Each entry of ``feature_cols`` is one input of the model, as in Horovod: a column name
(a scalar, an array or an ML vector column), or a *feature group*, a list of scalar
columns of one dtype stacked in order into one ``(rows, len(group))`` input. A Dask or
Spark frame of 64 scalar columns feeds one ``Linear(64, ...)`` with
``feature_cols=[cols]``; ``feature_cols=cols`` calls the model with 64 inputs.

Dask frames
-----------
``dd.from_pandas`` turns object columns into strings under Dask's default
``dataframe.convert-string``, arrays included (``"[0.1 0.2]"``). The Dask source
(:meth:`hora.store.sources.DaskSource.for_columns`) rebuilds such a frame from its pandas source without the conversion, so array columns
reach hora as arrays whatever the user's Dask config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from hora.errors import ConfigError, DataError
from hora.store.columns import MASK_SUFFIX
from hora.store.dataset import ColumnSpec, group_dtype
from hora.store.sources import DaskSource, PandasSource, Source

#: Rows taken from the DataFrame for the driver-side checks.
SAMPLE_ROWS = 16


def group_key(columns: Sequence[str]) -> str:
    """The name a feature group goes by in batches and messages: ``"[a,b,c]"``."""
    return "[" + ",".join(columns) + "]"


@dataclass(frozen=True)
class Features:
    """The feature inputs of ``feature_cols``: one per entry, a column or a group of columns.

    Attributes:
        entries: per input, the column name or the tuple of grouped column names.
    """

    entries: tuple[str | tuple[str, ...], ...]

    @classmethod
    def parse(cls, feature_cols: Any) -> "Features":
        """Normalize ``feature_cols`` (a name, or a list of names and lists of names).

        Raises:
            ConfigError: empty, not names, an empty group, or a column named twice.
        """
        if feature_cols is None:
            raise ConfigError("feature_cols is required: the names of the feature columns")
        if isinstance(feature_cols, str):
            feature_cols = [feature_cols]
        try:
            items = list(feature_cols)
        except TypeError as exc:
            raise ConfigError(f"feature_cols must be a list of column names, got {feature_cols!r}") from exc
        if not items:
            raise ConfigError("feature_cols must name at least one column")
        entries: list[str | tuple[str, ...]] = []
        for item in items:
            if isinstance(item, str) and item:
                entries.append(item)
            elif isinstance(item, (list, tuple)):
                if not item or not all(isinstance(c, str) and c for c in item):
                    raise ConfigError(f"feature group {list(item)!r} in feature_cols must be a non-empty list of column names")
                entries.append(tuple(item))
            else:
                raise ConfigError(f"feature_cols must hold column names or lists of column names, got {item!r}")
        flat = [c for e in entries for c in ((e,) if isinstance(e, str) else e)]
        dupes = sorted({c for c in flat if flat.count(c) > 1})
        if dupes:
            raise ConfigError(f"feature_cols names the column(s) {dupes} more than once")
        return cls(tuple(entries))

    @property
    def keys(self) -> list[str]:
        """One name per model input (a group's is :func:`group_key`; a mask's is ``<col>_mask``)."""
        return [e if isinstance(e, str) else group_key(e) for e in self.entries]

    @property
    def masks(self) -> dict[str, str]:
        """``{"<col>_mask": col}`` for each entry ``<col>_mask`` whose ``<col>`` is an entry too:
        the padding mask of a variable-length column, made per batch (not a column of the frame)."""
        names = {e for e in self.entries if isinstance(e, str)}
        return {e: e[:-len(MASK_SUFFIX)] for e in self.entries
                if isinstance(e, str) and e.endswith(MASK_SUFFIX) and e[:-len(MASK_SUFFIX)] in names}

    @property
    def columns(self) -> list[str]:
        """Every feature column, in order (what is materialized and read; masks are made, not read)."""
        masks = self.masks
        return [c for e in self.entries for c in ((e,) if isinstance(e, str) else e) if c not in masks]

    @property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """``{group key: its columns}``."""
        return {group_key(e): e for e in self.entries if not isinstance(e, str)}

    def as_config(self) -> list[str | list[str]]:
        """The JSON-able form (``feature_cols`` as the user writes it)."""
        return [e if isinstance(e, str) else list(e) for e in self.entries]

    def stack(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``batch`` with one ``(rows, k)`` array per group added under its key (members stay)."""
        groups = self.groups
        if not groups:
            return batch
        out = dict(batch)
        for key, cols in groups.items():
            out[key] = np.stack([np.asarray(batch[c]).reshape(len(batch[c])) for c in cols], axis=1)
        return out

    def inputs(self, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One array per model input from per-column arrays (groups stacked)."""
        stacked = self.stack(arrays)
        return [stacked[k] for k in self.keys]

    def check_sample(self, sample: dict[str, np.ndarray]) -> None:
        """Every member of a group is a scalar column, all of one dtype.

        Raises:
            ConfigError: names the group, the column and its shape or dtype.
        """
        for key, cols in self.groups.items():  # (the reader checks the stored specs by the same rule)
            group_dtype(key, {c: ColumnSpec(str(sample[c].dtype), sample[c].shape[1:]) for c in cols})


def hint_grouping(features: Features) -> str:
    """Advice for a model called with the wrong number of inputs."""
    n = len(features.entries)
    if n > 1 and all(isinstance(e, str) for e in features.entries):
        return (f"; hora calls the model with one input per feature_cols entry ({n} here, as Horovod does): to feed "
                f"several scalar columns as one input, group them: feature_cols=[{features.columns[:3]!r}...]")
    return ""


# ---------------------------------------------------------------------------------------
# the frame's engine (its Source) and samples
# ---------------------------------------------------------------------------------------
def source_of(df: Any) -> Source:
    """The :class:`~hora.store.sources.Source` of ``df``'s engine (Spark, Dask, pandas, a Ray Dataset),
    decided once at the top of ``fit`` and ``transform``; ``df`` itself when it is a Source.

    Raises:
        DataError: ``df`` is none of those.
    """
    if isinstance(df, Source):  # decided already: passed through as it is
        return df
    from hora.store.materialize import make_source

    try:
        return make_source(df)
    except DataError:
        raise DataError(f"fit needs a Spark, Dask or pandas DataFrame or a Ray Dataset, got "
                        f"{type(df).__module__}.{type(df).__name__}") from None


def _face_sources() -> dict[str, tuple[type, ...]]:
    """The sources each face takes: ``hora.spark`` Spark frames, ``hora.dask`` the rest."""
    from hora.store.ray_source import RaySource
    from hora.store.spark_source import SparkSource

    return {"hora.spark": (SparkSource,), "hora.dask": (PandasSource, DaskSource, RaySource)}


def check_face(df: Any, face: str, what: str) -> Source:
    """The :class:`~hora.store.sources.Source` of ``df`` when the face ``face`` (``"hora.spark"`` or
    ``"hora.dask"``) takes it.

    Raises:
        TypeError: a frame of the other face's engine (pandas or Dask given to ``hora.spark``, Spark
            given to ``hora.dask``), naming the face to use.
        DataError: ``df`` is not a frame hora knows.
    """
    source = source_of(df)
    faces = _face_sources()
    if not isinstance(source, faces[face]):
        other = next(name for name, takes in faces.items() if isinstance(source, takes))
        cls = what.split(".", 1)[0]
        frame = source.frame
        hint = (f"use {other}.{cls} for it" + (", or spark.createDataFrame(pdf) to make it a Spark "
                "DataFrame" if isinstance(source, PandasSource) else ""))
        raise TypeError(f"{what} takes {'a Spark DataFrame' if face == 'hora.spark' else 'a Dask or pandas DataFrame or a Ray Dataset'}"
                        f", got {source.description} ({type(frame).__module__}.{type(frame).__name__}): {hint}")
    return source


def check_columns(source: Source, roles: list[tuple[str, str]]) -> None:
    """Every ``(role, column)`` exists in the frame of ``source``.

    Raises:
        DataError: names each missing column, its role, and the columns there are.
    """
    have = set(source.columns())
    missing = [(role, c) for role, c in roles if c not in have]
    if missing:
        desc = ", ".join(f"{c!r} ({role})" for role, c in missing)
        raise DataError(f"column(s) {desc} not in the {source.noun}; its columns are {sorted(have)}")


def series_to_numpy(values: Any, vector_dtype: str = "float32") -> np.ndarray:
    """A pandas Series (or sequence) of scalars, lists, numpy arrays or Spark ML vectors -> one numpy array.

    Raises:
        DataError: rows of different lengths.
    """
    import pandas as pd

    if isinstance(values, pd.Series):
        if values.dtype != object:
            return values.to_numpy()
        values = values.tolist()
    items = list(values)
    if not items:
        return np.zeros((0,), dtype=vector_dtype)
    first = items[0]
    if hasattr(first, "toArray"):  # pyspark.ml.linalg Dense/SparseVector
        rows = [v.toArray() for v in items]
    elif isinstance(first, (list, tuple, np.ndarray)):
        rows = [np.asarray(v) for v in items]
    else:
        return np.asarray(items)
    shapes = {r.shape for r in rows}
    if len(shapes) != 1:
        raise DataError(f"array values have different shapes {sorted(shapes)[:5]}; hora needs fixed-size arrays")
    out = np.stack(rows)
    if out.dtype.kind == "f":
        out = out.astype(vector_dtype, copy=False)
    return out


def column_sample(values: Any, name: str, compress_sparse: bool = False) -> tuple[np.ndarray, ColumnSpec]:
    """A few rows of a column as the reader gives them, and their :class:`ColumnSpec`: bytes and
    strings as object arrays (``"binary"`` / ``"string"``), arrays of different lengths as an object
    array of 1-d arrays (``"ragged"``), ML vectors as ``(indices, values)`` pairs with
    ``compress_sparse`` (``"sparse"``), everything else as :func:`series_to_numpy` makes it.

    Raises:
        DataError: values hora cannot feed (names the column).
    """
    import pandas as pd

    if isinstance(values, np.ndarray) and values.dtype.kind in "biuf":  # numbers, fixed-size arrays (a Ray batch)
        return values, ColumnSpec(values.dtype.name, values.shape[1:])
    if isinstance(values, np.ndarray):  # objects or numpy strings: read as a pandas column is
        values = pd.Series(list(values), dtype=object)
    items = values.tolist() if isinstance(values, pd.Series) and values.dtype == object else None
    if items is None and isinstance(values, pd.Series) and pd.api.types.is_string_dtype(values.dtype):
        items = values.astype(object).tolist()
    if items:
        first = items[0]
        if isinstance(first, (bytes, bytearray, memoryview)):
            return np.array([bytes(v) for v in items] + [b""], dtype=object)[:-1], ColumnSpec("object", kind="binary")
        if isinstance(first, str):
            return np.array(items + [""], dtype=object)[:-1], ColumnSpec("object", kind="string")
        if compress_sparse and hasattr(first, "toArray"):
            out = np.empty(len(items), dtype=object)
            for i, v in enumerate(items):
                idx = np.asarray(getattr(v, "indices", np.arange(len(v))), dtype=np.int32)
                out[i] = (idx, np.asarray(v.values, dtype=np.float32))
            return out, ColumnSpec("float32", kind="sparse", size=int(first.size))
        if isinstance(first, (list, tuple, np.ndarray)) and not hasattr(first, "toArray"):
            rows = [np.asarray(v) for v in items]
            if len({r.shape for r in rows}) > 1 and all(r.ndim == 1 for r in rows):
                out = np.empty(len(rows), dtype=object)
                for i, r in enumerate(rows):
                    out[i] = r
                return out, ColumnSpec(str(rows[0].dtype), (max(len(r) for r in rows),), kind="ragged")
    arr = series_to_numpy(values)
    if arr.dtype.kind in "USO":
        raise DataError(f"column {name!r} holds {arr.dtype} values; hora needs numbers, numeric arrays, bytes or strings")
    return arr, ColumnSpec(arr.dtype.name, arr.shape[1:])


def sample_numpy(source: Source, columns: Sequence[str], rows: int = SAMPLE_ROWS,
                 config: Any = None, roles: list[tuple[str, str]] | None = None) -> dict[str, np.ndarray]:
    """The first ``rows`` rows of ``columns`` of the frame of ``source`` as numpy arrays (for the
    driver-side checks); with the estimator's ``config``, as a rank's batch reaches the model: images
    decoded, sequences padded (with their masks), sparse vectors batched, ``collate_fn`` applied (see
    :func:`sample_batch`). ``roles``: ``(role, column)`` pairs checked first (:func:`check_columns`).

    Raises:
        DataError: a column of ``roles`` is missing, the DataFrame is empty, or a column holds values
            hora cannot feed.
    """
    if roles:
        check_columns(source, roles)
    columns = list(dict.fromkeys(columns))
    pdf = source.head(columns, rows)  # a Ray Dataset's: {column: numpy array}; DataError when empty
    if len(pdf) == 0:
        raise DataError("the DataFrame is empty: nothing to train on")
    compress = bool(getattr(config, "compress_sparse_cols", False)) and source.compresses_sparse
    out, specs = {}, {}
    for c in columns:
        out[c], specs[c] = column_sample(pdf[c], c, compress)
    if config is None:
        for c, spec in specs.items():
            if not spec.is_dense:
                raise DataError(f"column {c!r} holds {spec.kind} values; hora needs numbers or fixed-size numeric arrays")
        return out
    return sample_batch(out, specs, config)


def fixed_batch_shapes(input_shapes: Any) -> bool:
    """Whether an ``input_shapes`` entry fixes the batch dimension (has no ``-1``): each batch is
    reshaped to exactly that shape, as Horovod does, so a check must use ``batch_size`` rows."""
    return bool(input_shapes) and any(-1 not in [int(d) for d in shape] for shape in input_shapes)


def sample_dataset(store: Any, info: Any, roles: list[tuple[str, str]], rows: int, config: Any) -> dict[str, Any]:
    """The first ``rows`` rows of a materialized dataset's train split as a rank's batch has them
    (for the driver-side checks of ``fit_on_parquet``; see :func:`sample_batch`).

    Raises:
        DataError: a ``(role, column)`` the dataset does not hold (names it and the dataset's folder).
    """
    from hora.store import make_reader

    missing = [(role, c) for role, c in roles if c not in info.columns]
    if missing:
        desc = ", ".join(f"{c!r} ({role})" for role, c in missing)
        raise DataError(f"column(s) {desc} not in the prepared dataset "
                        f"{store.url_for(store.layout.dataset_dir(info.fingerprint))}; it holds {sorted(info.columns)}")
    columns = list(dict.fromkeys(c for _, c in roles))
    reader = make_reader(store, info, "train", batch_size=rows, shuffle=False, prefetch=0, columns=columns)
    batch = next(iter(reader))
    return sample_batch(batch, {c: info.columns[c] for c in columns}, config)


def sample_batch(sample: dict[str, np.ndarray], specs: dict[str, ColumnSpec], config: Any) -> dict[str, Any]:
    """``sample`` (columns as the reader gives them) as the model gets it on a rank: through the
    estimator's column operations (:func:`hora.estimators.data.columns.column_ops`), then, where a
    feature is still bytes or text, through ``transformation_fn`` (a tokenizer).

    Raises:
        DataError: a decode_fn / collate_fn fails, or a feature stays bytes or text (names it).
    """
    from hora.estimators.data.columns import column_ops

    ops = column_ops(config, specs, getattr(config, "decode_fn", None), getattr(config, "collate_fn", None))
    batch = ops(sample) if ops is not None else dict(sample)
    features = config.features
    textual = [k for k in features.keys if k in batch and _is_text(batch[k])]
    if textual and config.transformation_fn is not None:
        batch = config.transformation_fn(batch)
        textual = [k for k in features.keys if k in batch and _is_text(batch[k])]
    if textual:
        raise DataError(f"feature column(s) {textual} hold bytes or strings when they reach the model: pass "
                        "tokenizer= (a Hugging Face tokenizer) to tokenize text, decode bytes (decode_fn), or turn "
                        "them into numbers in transformation_fn or collate_fn")
    return batch


def _is_text(arr: Any) -> bool:
    arr = np.asarray(arr) if isinstance(arr, (list, np.ndarray)) else None
    return arr is not None and (arr.dtype.kind in "US" or (arr.dtype == object and len(arr) > 0 and
                                                           isinstance(arr.flat[0], (str, bytes))))


__all__ = ["Features", "group_key", "hint_grouping", "source_of", "check_face", "check_columns", "series_to_numpy", "sample_numpy",
           "sample_batch", "column_sample", "SAMPLE_ROWS", "fixed_batch_shapes", "sample_dataset"]
