"""The driver's side of a materialization: check the parts' stats, assemble the dataset, commit it.

:func:`assemble` turns the writers' stats into a :class:`DatasetInfo` (raising DataError
for bad data), :func:`ensure_min_files` re-cuts a split that came out in fewer files
than ``num_proc``, and :func:`commit` moves the attempt's files into place and writes the
metadata and then the commit marker, holding the dataset's commit lock
(:meth:`hora.store.lease.Lease.commit_lock`), so concurrent attempts never mix or delete
each other's files. :func:`load_dataset_info` finds a committed dataset.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hora.errors import DataError, StoreError
from hora.store.dataset import ColumnSpec, DatasetInfo, FileInfo
from hora.store.layout import COMMIT_MARKER, join
from hora.store.lease import Lease, sweep_dead
from hora.store.store import Store
from hora.store.writer import SplitWriter, WritePlan, is_sparse_type

logger = logging.getLogger(__name__)


def assemble(fp: str, store: Store, plan: WritePlan, stats: list[dict], kind: str,
              options: dict[str, Any], want_val: bool) -> DatasetInfo:
    rows_in = sum(s["rows_in"] for s in stats)
    if rows_in == 0:
        raise DataError("the DataFrame is empty (0 rows)")
    bad_val = sum(s["bad_validation"] for s in stats)
    if bad_val:
        examples = [e for s in stats for e in s["bad_validation_examples"]][:5]
        raise DataError(
            f"validation column {plan.val_col!r} must hold booleans or 0/1 without nulls; "
            f"{bad_val} rows hold other values (e.g. {', '.join(examples)})"
        )
    label_nan: dict[str, int] = {}
    for s in stats:
        for c, n in s["label_nan"].items():
            label_nan[c] = label_nan.get(c, 0) + n
    if label_nan and plan.label_nan == "error":
        detail = ", ".join(f"{c!r}: {n} of {rows_in} rows" for c, n in label_nan.items())
        raise DataError(
            f"NaN or null values in label column(s) {detail}; drop or fill them, or pass label_nan='drop'"
        )
    nulls: dict[str, int] = {}
    for s in stats:
        for c, n in s["nulls"].items():
            nulls[c] = nulls.get(c, 0) + n
    nulls = {c: n for c, n in nulls.items() if not (c in plan.label_cols and plan.label_nan == "drop")}
    if nulls:
        detail = ", ".join(f"{c!r}: {n}" for c, n in nulls.items())
        raise DataError(f"null values in column(s) {detail}; fill or drop them before fitting")
    variable = sorted({c for s in stats for c in s["variable"]})
    shapes: dict[str, list[int]] = {}
    for s in stats:
        for c, shape in s["shapes"].items():
            if c in shapes and shapes[c] != shape:
                variable.append(c)
            shapes.setdefault(c, shape)
    variable = sorted(set(variable))
    # variable-length 1-d arrays are stored as lists (a "ragged" column): its longest row
    max_len: dict[str, int] = {}
    for s in stats:
        for c, n in s.get("max_len", {}).items():
            max_len[c] = max(max_len.get(c, 0), int(n))
        for c, shape in s["shapes"].items():
            if c in variable and len(shape) == 1:
                max_len[c] = max(max_len.get(c, 0), int(shape[0]))
    sparse_size: dict[str, int] = {}
    for s in stats:
        for c, n in s.get("sparse_size", {}).items():
            if sparse_size.setdefault(c, n) != n:
                raise DataError(f"column {c!r} holds ML vectors of different sizes ({sparse_size[c]} and {n}); "
                                "hora needs one size per vector column")
    nnz: dict[str, int] = {}
    for s in stats:
        for c, n in s.get("nnz", {}).items():
            nnz[c] = nnz.get(c, 0) + int(n)
    dropped = sum(s["dropped"] for s in stats)
    if dropped:
        logger.warning("materialize: dropped %d rows with NaN/null labels (label_nan='drop')", dropped)
    types = {}
    for s in stats:
        for c, t in s["types"].items():
            types.setdefault(c, t)
    files: dict[str, list[FileInfo]] = {"train": [], "val": []}
    for s in sorted(stats, key=lambda s: s["part"]):
        for split in ("train", "val"):
            f = s["files"].get(split)
            if f:
                files[split].append(FileInfo.written(f))
    if not files["train"]:
        raise DataError("the training split is empty (every row went to validation or was dropped)")
    if want_val and not files["val"]:
        raise DataError(
            f"the validation split is empty (validation={options['validation']!r} selected no rows); "
            "use a larger fraction or mark some rows"
        )
    # column specs from the first written file's schema (exact Arrow types) and the shapes
    first = files["train"][0]
    schema = _read_schema(store, join(plan.tmp_dir, first.path))
    columns = {c: _column_spec(c, schema.field(c).type, shapes, variable, max_len, sparse_size)
               for c in plan.columns}
    if nnz:
        logger.info("materialize: sparse column(s) %s", ", ".join(
            f"{c!r} (size {sparse_size.get(c, 0)}, {n} non-zeros)" for c, n in nnz.items()))
    return DatasetInfo(
        fingerprint=fp,
        dataset_dir=store.layout.dataset_dir(fp),
        columns=columns,
        feature_cols=tuple(options["feature_cols"]),
        label_cols=tuple(options["label_cols"]),
        sample_weight_col=options["sample_weight_col"],
        files={k: tuple(v) for k, v in files.items()},
        source=kind,
        options=options,
    )


def _column_spec(c: str, arrow_type: pa.DataType, shapes: dict[str, list[int]], variable: list[str],
                 max_len: dict[str, int], sparse_size: dict[str, int]) -> ColumnSpec:
    """The :class:`ColumnSpec` of stored column ``c`` from its Arrow type and the writers' counts.

    Raises:
        DataError: nested arrays of different lengths, or a type hora cannot store.
    """
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return ColumnSpec(dtype="object", kind="binary")
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return ColumnSpec(dtype="object", kind="string")
    if is_sparse_type(arrow_type):
        values = arrow_type.field(1).type.value_type
        return ColumnSpec(dtype=np.dtype(values.to_pandas_dtype()).name, kind="sparse", size=sparse_size.get(c, 0))
    t = arrow_type
    depth = 0
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
        depth += 1
    try:
        dtype = np.dtype(t.to_pandas_dtype()).name
    except NotImplementedError as exc:
        raise DataError(f"column {c!r} has Arrow type {arrow_type}, which hora cannot store") from exc
    if c in variable:
        if depth != 1:
            raise DataError(
                f"array column {c!r} holds nested arrays of different lengths; hora stores variable-length "
                "1-d arrays (token ids, sequences) and fixed-shape nested arrays (pad or truncate them)"
            )
        return ColumnSpec(dtype=dtype, shape=(max_len.get(c, 0),), kind="ragged")
    shape = tuple(shapes.get(c, [0] * depth)) if depth else ()
    if len(shape) != depth:
        raise DataError(f"column {c!r}: shape {shape} does not match its {depth}-level nesting")
    return ColumnSpec(dtype=dtype, shape=shape)


def _read_schema(store: Store, path: str) -> pa.Schema:
    if store.is_local:
        return pq.read_schema(path)
    with store.open(path, "rb") as fh:
        return pq.read_schema(fh)


def ensure_min_files(store: Store, plan: WritePlan, info: DatasetInfo, num_proc: int) -> DatasetInfo:
    """Re-cut a split into ``num_proc`` balanced files when the engine produced fewer (streaming, row group by row group)."""
    new_files = dict(info.files)
    for split, files in info.files.items():
        rows = sum(f.rows for f in files)
        if not files or len(files) >= num_proc or rows < num_proc:
            continue
        logger.info("materialize: re-cutting %s split (%d files, %d rows) into %d files", split, len(files), rows, num_proc)
        bounds = np.linspace(0, rows, num_proc + 1).astype(int)
        target = [int(b) for b in np.diff(bounds)]
        rg = plan.rows_per_row_group
        out: list[FileInfo] = []
        writer: SplitWriter | None = None
        idx, written = 0, 0

        def _new_writer(i: int) -> SplitWriter:
            w = SplitWriter(plan, split, i, "-r")
            w.rows_per_group = rg if rg is not None else files[0].row_groups[0]
            return w

        writer = _new_writer(0)
        for f in files:
            path = join(plan.tmp_dir, f.path)
            fh = None if store.is_local else store.open(path, "rb")
            try:
                pf = pq.ParquetFile(path if fh is None else fh)
                for g in range(pf.num_row_groups):
                    table = pf.read_row_group(g)
                    while table.num_rows:
                        take = min(table.num_rows, target[idx] - written)
                        writer.add(table.slice(0, take))
                        written += take
                        table = table.slice(take)
                        if written == target[idx]:
                            res = writer.close()
                            out.append(FileInfo.written(res))
                            idx, written = idx + 1, 0
                            if idx < num_proc:
                                writer = _new_writer(idx)
            finally:
                if fh is not None:
                    fh.close()
            store.rm(path)
        new_files[split] = tuple(out)
    return replace(info, files=new_files)


def commit(store: Store, plan: WritePlan, info: DatasetInfo, overwrite: bool, lease: Lease) -> DatasetInfo:
    """Make this attempt's files the committed dataset, or adopt a commit another attempt made first.

    Holds the dataset's commit lock throughout: removes what an earlier (uncommitted,
    replaced or dead) attempt left, never a live attempt's staging folder; moves the files;
    writes ``_metadata.json``; writes the marker last.

    Returns:
        the committed DatasetInfo (``reused=True`` when another attempt's commit was adopted).

    Raises:
        StoreError: the store fails, or another attempt holds the commit for too long.
    """
    fp = info.fingerprint
    layout = store.layout
    marker = layout.commit_marker(fp)
    with lease.commit_lock():
        if store.exists(marker):
            if not overwrite:
                found = load_dataset_info(store, fp)
                if found is not None:
                    logger.info("materialize: %s was committed by another attempt meanwhile; using it", fp)
                    store.rm(plan.tmp_dir, recursive=True)
                    return replace(found, reused=True)
            store.rm(marker)
        # No marker now: what lies in the splits is an interrupted or replaced attempt's, never reused.
        for split in ("train", "val"):
            store.rm(layout.split_dir(fp, split), recursive=True)
        store.rm(layout.metadata_path(fp))
        sweep_dead(store, fp, keep=plan.attempt)
        final_files: dict[str, tuple[FileInfo, ...]] = {}
        for split, files in info.files.items():
            if files:
                store.makedirs(layout.split_dir(fp, split))
            final_files[split] = files
            for f in files:
                store.mv(join(plan.tmp_dir, f.path), join(info.dataset_dir, f.path))
        store.rm(plan.tmp_dir, recursive=True)
        info = replace(info, files=final_files, reused=False)
        meta = info.to_json().encode("utf-8")
        store.write_bytes(layout.metadata_path(fp), meta)
        store.write_bytes(
            marker,
            json.dumps({"fingerprint": fp, "attempt": plan.attempt, "metadata_sha256": hashlib.sha256(meta).hexdigest(),
                        "marker": COMMIT_MARKER}).encode("utf-8"),
        )
    return info


def load_dataset_info(store: Store, fingerprint: str) -> DatasetInfo | None:
    """The committed dataset with this fingerprint, or None when there is none (or it is incomplete).

    A dataset counts as committed only when its marker exists and names the exact
    metadata next to it (a content hash), so a half-written attempt is never reused.

    Raises:
        StoreError: the store cannot be read.
    """
    marker_path = store.layout.commit_marker(fingerprint)
    if not store.exists(marker_path):
        return None
    try:
        marker = json.loads(store.read_bytes(marker_path))
        raw = store.read_bytes(store.layout.metadata_path(fingerprint))
    except (StoreError, ValueError) as exc:
        logger.warning("dataset %s has a commit marker but unreadable metadata (%s); ignoring it", fingerprint, exc)
        return None
    if marker.get("metadata_sha256") != hashlib.sha256(raw).hexdigest():
        logger.warning("dataset %s: metadata does not match its commit marker; ignoring it", fingerprint)
        return None
    info = DatasetInfo.from_json(raw)
    if info.fingerprint != fingerprint:
        logger.warning("dataset %s: metadata names fingerprint %s; ignoring it", fingerprint, info.fingerprint)
        return None
    # The dataset may have been moved with its store: trust the layout, not the recorded dir.
    return replace(info, dataset_dir=store.layout.dataset_dir(fingerprint))


__all__ = ["assemble", "ensure_min_files", "commit", "load_dataset_info"]
