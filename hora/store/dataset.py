"""What a materialized dataset is: :class:`DatasetInfo` and its parts (plain, picklable, JSON round-trip)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

import numpy as np

from hora.errors import ConfigError, StoreError
from hora.store.layout import SPLITS, join

#: Version of the ``_metadata.json`` format; bump on incompatible changes (part of the fingerprint).
FORMAT_VERSION = 1
#: How a stored column is laid out (:attr:`ColumnSpec.kind`).
COLUMN_KINDS = ("dense", "binary", "string", "ragged", "sparse")


@dataclass(frozen=True)
class ColumnSpec:
    """dtype and per-row shape of a stored column.

    Attributes:
        dtype: numpy dtype name (``"float32"``, ``"int64"``, ``"bool"``...); of the values
            for ``"ragged"`` and ``"sparse"`` columns, ``"object"`` for binary and string ones.
        shape: shape of one row's value: ``()`` for scalars, ``(n,)`` for vectors and
            1-d arrays, ``(a, b)`` for nested arrays. Batches have shape ``(batch, *shape)``.
            A ``"ragged"`` column's is ``(longest row,)``; binary, string and sparse: ``()``.
        kind: how the column is stored and comes out of the reader: ``"dense"`` (a numeric
            array of ``(rows, *shape)``); ``"binary"`` / ``"string"`` (Parquet binary / UTF-8,
            batches of ``bytes`` / ``str`` objects); ``"ragged"`` (a Parquet list of numbers of
            any length per row, batches of 1-d arrays as objects); ``"sparse"`` (a Spark ML
            vector stored as ``indices`` int32 + ``values``, batches of ``(indices, values)``
            pairs as objects, ``size`` the vector's dimension).
        size: the dimension of a ``"sparse"`` column (0 otherwise).
    """

    dtype: str
    shape: tuple[int, ...] = ()
    kind: str = "dense"
    size: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        np.dtype(self.dtype)  # raises TypeError for nonsense
        if self.kind not in COLUMN_KINDS:
            raise StoreError(f"column kind {self.kind!r} is unknown; expected one of {COLUMN_KINDS}")

    @property
    def is_dense(self) -> bool:
        """A fixed-shape numeric column (batches of ``(rows, *shape)`` arrays)."""
        return self.kind == "dense"

    @property
    def batch_dtype(self) -> str:
        """The dtype of this column's arrays in the reader's batches (``"object"`` unless dense)."""
        return self.dtype if self.is_dense else "object"

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """The per-row shape of this column's arrays in the reader's batches (``()`` unless dense)."""
        return self.shape if self.is_dense else ()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape)}
        if not self.is_dense:
            d["kind"] = self.kind
        if self.size:
            d["size"] = self.size
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ColumnSpec":
        return cls(dtype=d["dtype"], shape=tuple(d.get("shape", ())), kind=d.get("kind", "dense"),
                   size=int(d.get("size", 0)))


def group_dtype(key: str, members: Mapping[str, ColumnSpec]) -> str:
    """The dtype of feature group ``key``, whose member columns have the specs ``members``:
    a group stacks scalar columns of one dtype into ``(rows, len(members))``. The one rule
    the driver checks on a sample of arrays before any worker starts and the reader checks
    on the stored column specs.

    Raises:
        ConfigError: a member is not a scalar column, or the members' dtypes differ (names
            the group and the column, or every member's dtype).
    """
    for name, spec in members.items():
        if spec.shape or not spec.is_dense:
            raise ConfigError(f"feature group {key} holds column {name!r} of per-row shape {spec.shape}; "
                              "a group stacks scalar columns only (list array columns on their own)")
    dtypes = {spec.dtype for spec in members.values()}
    if len(dtypes) > 1:
        raise ConfigError(f"feature group {key} mixes dtypes {({n: s.dtype for n, s in members.items()})}; "
                          "cast its columns to one dtype first (or split the group)")
    return dtypes.pop()


@dataclass(frozen=True)
class FileInfo:
    """One Parquet file of a split.

    Attributes:
        path: path relative to the dataset folder (``train/part-00000-....parquet``).
        rows: number of rows.
        row_groups: rows in each row group, in file order (sums to ``rows``).
        size: its bytes (None in datasets committed before hora recorded it).
        checksum: the checksum of its bytes (:mod:`hora.store.integrity`; None likewise).
    """

    path: str
    rows: int
    row_groups: tuple[int, ...]
    size: int | None = None
    checksum: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "row_groups", tuple(int(r) for r in self.row_groups))
        if sum(self.row_groups) != self.rows:
            raise StoreError(f"file {self.path}: row groups {self.row_groups} do not sum to {self.rows} rows")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.path, "rows": self.rows, "row_groups": list(self.row_groups)}
        if self.checksum is not None:
            d.update(size=self.size, checksum=self.checksum)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FileInfo":
        size = d.get("size")
        return cls(path=d["path"], rows=int(d["rows"]), row_groups=tuple(d["row_groups"]),
                   size=None if size is None else int(size), checksum=d.get("checksum"))

    @classmethod
    def written(cls, res: dict[str, Any]) -> "FileInfo":
        """From a writer's result (``path``, ``rows``, ``row_groups``, ``size``, ``checksum``)."""
        return cls(path=res["path"], rows=res["rows"], row_groups=tuple(res["row_groups"]), size=res.get("size"),
                   checksum=res.get("checksum"))


@dataclass(frozen=True)
class DatasetInfo:
    """A committed, materialized dataset: where its files are and what they hold.

    Returned by :func:`hora.store.materialize` and passed (pickled) to the training
    workers, which give it to :func:`hora.store.make_reader` with the Store.

    Attributes:
        fingerprint: identifies the data and the materialization options.
        dataset_dir: the dataset folder (an fsspec path in the store).
        columns: ``{name: ColumnSpec}`` for every stored column, in storage order.
        feature_cols, label_cols: the column names given to materialize.
        sample_weight_col: the sample weight column, or None.
        files: ``{"train": (FileInfo, ...), "val": (FileInfo, ...)}``.
        source: ``"spark"``, ``"dask"`` or ``"pandas"``.
        options: the materialization options that entered the fingerprint.
        reused: True when materialize found this dataset already committed.
    """

    fingerprint: str
    dataset_dir: str
    columns: dict[str, ColumnSpec]
    feature_cols: tuple[str, ...]
    label_cols: tuple[str, ...]
    sample_weight_col: str | None
    files: dict[str, tuple[FileInfo, ...]]
    source: str = "pandas"
    options: dict[str, Any] = field(default_factory=dict)
    reused: bool = False
    format_version: int = FORMAT_VERSION

    # derived ---------------------------------------------------------------------------
    def split_files(self, split: str) -> tuple[FileInfo, ...]:
        """The files of ``split`` ("train" or "val")."""
        if split not in SPLITS:
            raise StoreError(f"unknown split {split!r}; expected one of {SPLITS}")
        return tuple(self.files.get(split, ()))

    def split_rows(self, split: str) -> int:
        """Number of rows in ``split``."""
        return sum(f.rows for f in self.split_files(split))

    def file_paths(self, split: str) -> list[str]:
        """Full store paths of the Parquet files of ``split``."""
        return [join(self.dataset_dir, f.path) for f in self.split_files(split)]

    @property
    def train_files(self) -> list[str]:
        """Full store paths of the training files."""
        return self.file_paths("train")

    @property
    def val_files(self) -> list[str]:
        """Full store paths of the validation files (empty without validation)."""
        return self.file_paths("val")

    @property
    def train_rows(self) -> int:
        return self.split_rows("train")

    @property
    def val_rows(self) -> int:
        return self.split_rows("val")

    @property
    def has_val(self) -> bool:
        return self.val_rows > 0

    # serialization ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (the content of ``_metadata.json``, plus ``reused``)."""
        return {
            "format_version": self.format_version,
            "fingerprint": self.fingerprint,
            "dataset_dir": self.dataset_dir,
            "columns": [{"name": n, **c.to_dict()} for n, c in self.columns.items()],
            "feature_cols": list(self.feature_cols),
            "label_cols": list(self.label_cols),
            "sample_weight_col": self.sample_weight_col,
            "files": {s: [f.to_dict() for f in fs] for s, fs in self.files.items()},
            "rows": {s: sum(f.rows for f in fs) for s, fs in self.files.items()},
            "source": self.source,
            "options": self.options,
            "reused": self.reused,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DatasetInfo":
        """Rebuild from :meth:`to_dict` output.

        Raises:
            StoreError: missing keys or an unsupported format version.
        """
        try:
            version = int(d.get("format_version", -1))
            if version != FORMAT_VERSION:
                raise StoreError(f"dataset metadata format {version} is not supported (expected {FORMAT_VERSION})")
            return cls(
                fingerprint=d["fingerprint"],
                dataset_dir=d["dataset_dir"],
                columns={c["name"]: ColumnSpec.from_dict(c) for c in d["columns"]},
                feature_cols=tuple(d["feature_cols"]),
                label_cols=tuple(d["label_cols"]),
                sample_weight_col=d.get("sample_weight_col"),
                files={s: tuple(FileInfo.from_dict(f) for f in fs) for s, fs in d["files"].items()},
                source=d.get("source", "pandas"),
                options=dict(d.get("options", {})),
                reused=bool(d.get("reused", False)),
                format_version=version,
            )
        except (KeyError, TypeError) as exc:
            raise StoreError(f"dataset metadata is incomplete or malformed: {exc!r}") from exc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "DatasetInfo":
        try:
            d = json.loads(text)
        except ValueError as exc:
            raise StoreError(f"dataset metadata is not valid JSON: {exc}") from exc
        return cls.from_dict(d)


__all__ = ["ColumnSpec", "FileInfo", "DatasetInfo", "FORMAT_VERSION", "COLUMN_KINDS"]
