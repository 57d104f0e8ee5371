"""The fit's column operations on a batch: binary columns decoded, variable-length ones padded (with
their masks) or cut at ``max_length``, sparse ones batched, ``collate_fn`` applied. On a rank (the reader's
batches, :mod:`hora.estimators.worker.batches`), in the driver's sample check (:mod:`hora.estimators.data.frames`) and in
transform (:mod:`hora.estimators.driver.transform`), from the settings a fitted model keeps (:func:`inference_columns`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from hora.store.columns import ColumnOps, decode_image
from hora.store.dataset import ColumnSpec


def _decoders(specs: dict[str, ColumnSpec], decode_fn: dict | None) -> dict[str, Any]:
    """The decoder of every binary column of ``specs``: ``decode_fn[col]``, else
    :func:`hora.store.decode_image` (a None in ``decode_fn`` keeps the bytes)."""
    user = dict(decode_fn or {})
    return {c: user.get(c, decode_image) for c, spec in specs.items() if spec.kind == "binary"}


def _length_limits(specs: dict[str, ColumnSpec], max_length: int | dict | None) -> dict[str, int]:
    """``max_length`` per ragged column: a dict as given, an int for every ragged column of ``specs``."""
    if isinstance(max_length, dict):
        return dict(max_length)
    return {c: int(max_length) for c, spec in specs.items() if spec.kind == "ragged"} if max_length else {}


def column_ops(config: Any, specs: dict[str, ColumnSpec], decode_fn: dict | None, collate_fn: Callable | None,
               where: Callable[[int], str] | None = None) -> ColumnOps | None:
    """The :class:`~hora.store.ColumnOps` of a fit for columns of ``specs`` (None when no batch needs
    one): every binary feature column decoded by ``decode_fn[col]`` (default
    :func:`hora.store.decode_image`; None keeps the bytes), ragged columns padded (``max_length``,
    ``truncation``), sparse ones batched per ``sparse_format``, the ``<col>_mask`` inputs of
    ``feature_cols`` made, ``collate_fn`` applied."""
    features = config.features
    decode = _decoders({c: specs[c] for c in features.columns if c in specs}, decode_fn)
    ops = ColumnOps(specs=dict(specs), decode=decode, on_decode_error=config.on_decode_error or "raise",
                    max_length=_length_limits(specs, config.max_length), truncation=config.truncation is not False,
                    sparse_format=config.sparse_format or "csr", masks=features.masks, collate_fn=collate_fn,
                    where=where)
    return ops if ops.needed else None


#: the fit's column settings a fitted model keeps for transform (:func:`inference_columns`)
INFERENCE_COLUMN_SETTINGS = ("decode_fn", "max_length", "truncation", "collate_fn")


def inference_columns(config: Any, dataset: Any = None) -> dict[str, Any] | None:
    """The fit's ``decode_fn``, ``max_length``, ``truncation`` and ``collate_fn`` for the fitted
    model's transform, and its variable-length feature columns (``ragged``, from the materialized
    ``dataset``'s specs: a frame to transform whose rows happen to have one length is still
    padded, cut and masked as in training). None when all are the defaults: nothing to keep."""
    values = {k: getattr(config, k, None) for k in INFERENCE_COLUMN_SETTINGS}
    if values["truncation"] is not False:
        values["truncation"] = True
    specs = getattr(dataset, "columns", None) or {}
    values["ragged"] = sorted(c for c in config.features.columns if c in specs and specs[c].kind == "ragged")
    default = {"decode_fn": None, "max_length": None, "truncation": True, "collate_fn": None, "ragged": []}
    return None if values == default else values


def _as_ragged(values: np.ndarray, spec: ColumnSpec | None) -> tuple[np.ndarray, ColumnSpec]:
    """A column the fit saw as variable-length, as an object array of 1-d rows (a transform batch
    whose rows have one length arrives as a 2-d array)."""
    if spec is not None and spec.kind == "ragged":
        return values, spec
    rows = np.empty(len(values), dtype=object)
    for i, row in enumerate(values):
        rows[i] = np.asarray(row).reshape(-1)
    longest = max((len(r) for r in rows), default=0)
    return rows, ColumnSpec(str(np.asarray(values[0]).dtype) if len(values) else "float32", (longest,), kind="ragged")


def inference_arrays(features: Any, arrays: dict[str, np.ndarray], specs: dict[str, ColumnSpec],
                     columns: dict[str, Any] | None = None) -> dict[str, Any]:
    """Feature arrays of a frame to transform, as the model took them in training: binary columns
    decoded (the fit's ``decode_fn`` per column, else :func:`hora.store.decode_image`),
    variable-length ones (the fit's ``ragged`` columns, and any the batch shows) padded (to the
    fit's ``max_length``, cut or refused per its ``truncation``, else to the batch's longest row)
    with their ``<col>_mask`` inputs, sparse rows densified, then the fit's ``collate_fn`` (its
    batch holds the feature columns only: no labels at transform). ``columns``:
    :func:`inference_columns` of the fit (None: the defaults).

    Raises:
        DataError: an image that does not decode (names the column and the row), a row longer
            than ``max_length`` under ``truncation=False`` (names the column and the length).
    """
    columns = columns or {}
    specs = dict(specs)
    arrays = dict(arrays)
    for c in columns.get("ragged") or ():
        if c in arrays:
            arrays[c], specs[c] = _as_ragged(arrays[c], specs.get(c))
    ops = ColumnOps(specs=specs, decode=_decoders(specs, columns.get("decode_fn")), sparse_format="dense",
                    masks=features.masks, max_length=_length_limits(specs, columns.get("max_length")),
                    truncation=columns.get("truncation", True) is not False,
                    collate_fn=columns.get("collate_fn"))
    return ops(arrays) if ops.needed else arrays

def rows_per_forward(arrays: Sequence[np.ndarray], input_shapes: Any) -> int | None:
    """Rows one forward pass must take when an ``input_shapes`` entry fixes the batch dimension
    (no ``-1``; Horovod's ``[[2]]`` takes one row of 2 values), else None (any number).

    Raises:
        DataError: the fixed shape does not hold a whole number of rows (names the input).
    """
    if not input_shapes:
        return None
    for i, (arr, shape) in enumerate(zip(arrays, input_shapes)):
        dims = [int(d) for d in shape]
        if -1 in dims:
            continue
        per_row = int(np.prod(np.asarray(arr).shape[1:], dtype=np.int64)) or 1
        total = int(np.prod(dims, dtype=np.int64))
        if total % per_row:
            raise DataError(f"input_shapes[{i}]={dims} ({total} values) does not hold a whole number of rows of "
                            f"{per_row} values")
        return max(1, total // per_row)
    return None


__all__ = ["column_ops", "inference_arrays", "inference_columns", "INFERENCE_COLUMN_SETTINGS", "rows_per_forward"]
