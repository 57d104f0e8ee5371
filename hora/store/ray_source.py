"""Materialize a Ray Dataset: executed once, hashed and written where its blocks are.

* The needed columns of the dataset are executed once (``to_arrow_refs``): its blocks
  stay in Ray's object store for the hash and the write, so the user's pipeline (reads,
  ``map_batches``, shuffles) runs once and what is hashed is exactly what is written.
* Fingerprint: one small Ray task per block hashes the block's Arrow buffers (with its
  type, offset and length) where the block is; the token is the sorted block digests
  and the row count. The same rows in the same blocks give the same fingerprint, so a
  second ``fit`` reuses the committed dataset; a dataset whose blocks come out cut
  differently is materialized again (never a wrong reuse).
* Writing: one Ray task per block runs hora's Parquet writer (:func:`write_part`) into
  the attempt's staging folder through the pickled Store; a dataset of fewer blocks than
  ``num_proc`` has its blocks cut into row-balanced parts in those tasks. Ray's tensor
  columns (``ArrowTensorType``) are stored as nested lists, as every other source's
  arrays. ``memory://`` stores live in one process: the blocks are fetched to the driver
  one at a time and written there.
* On a cluster with nodes other than the driver's, one tiny task first checks that the
  tasks reach the store and see the driver's files (:func:`check_tasks_reach`).
* Every wait on Ray tasks gives up after ``HORA_RAY_MATERIALIZE_TIMEOUT`` seconds (default
  600) without one task finishing, naming the blocks still pending and the cluster's
  free resources.

Commit, leases and reuse are :func:`hora.store.materialize`'s, as for every source.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from typing import Any, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from hora import settings
from hora.errors import DataError, HoraError, StoreError
from hora.store import retry
from hora.store.layout import join
from hora.store.sources import Source, probe_answer_error, remove_probe, stored_kinds
from hora.store.store import ENV_STORE_TIMEOUT, Store, store_timeout
from hora.store.writer import WritePlan, _ndarray_to_list_array, write_part

logger = logging.getLogger(__name__)

ENV_MATERIALIZE_TIMEOUT = "HORA_RAY_MATERIALIZE_TIMEOUT"
DEFAULT_MATERIALIZE_TIMEOUT = 600.0  # seconds without one Ray task of a materialization finishing
PROBE_PREFIX = "_hora_ray_check-"


class BlockDigest(NamedTuple):
    """What the driver learns of one block before writing it."""

    rows: int
    digest: str
    schema: pa.Schema


def is_ray_dataset(obj: Any) -> bool:
    """Whether ``obj`` is a ``ray.data.Dataset`` (without importing Ray for other objects)."""
    if not type(obj).__module__.startswith("ray.data"):
        return False
    from ray.data import Dataset

    return isinstance(obj, Dataset)


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _list_leaf(t: pa.DataType) -> pa.DataType:
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return t


def arrow_kind(name: str, t: pa.DataType) -> str:
    """``"scalar"``, ``"array"``, ``"string"`` or ``"binary"`` for a column type hora can feed to a model.

    Raises:
        DataError: names the column and its type (objects, tensors of varying shapes).
    """
    if isinstance(t, pa.ExtensionType):
        shape = getattr(t, "shape", None)
        if shape is not None and any(d is None for d in shape):
            raise DataError(f"column {name!r} holds tensors of different shapes ({t}); hora needs one fixed shape "
                            "per column (pad or resize them first)")
        if shape is not None and _numeric(_list_leaf(t.storage_type)):
            return "array"
    elif _numeric(t):
        return "scalar"
    elif _numeric(_list_leaf(t)) and t != _list_leaf(t):
        return "array"
    elif pa.types.is_string(t) or pa.types.is_large_string(t):  # text: a tokenizer= or collate_fn encodes it
        return "string"
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    raise DataError(f"column {name!r} of the Ray Dataset has type {t}; hora can feed numeric/boolean scalars, "
                    "fixed-shape numeric arrays (lists or tensors), strings and bytes to a model (encode it first)")


def _for_writer(table: pa.Table) -> pa.Table:
    """``table`` with Ray's fixed-shape tensor columns as nested lists (what the writer stores)."""
    columns = []
    for col in table.columns:
        if isinstance(col.type, pa.ExtensionType) and getattr(col.type, "shape", None) is not None:
            col = pa.chunked_array([_ndarray_to_list_array(np.asarray(c.to_numpy())) for c in col.chunks]
                                   or [pa.nulls(0, pa.list_(col.type.storage_type.value_type))])
        columns.append(col)
    return pa.Table.from_arrays(columns, names=table.column_names)


def _digest(table: pa.Table) -> BlockDigest:
    """One block's rows, content hash and schema (runs where the block is)."""
    h = hashlib.sha256(str(table.schema).encode())
    for col in table.columns:
        for chunk in col.chunks:
            h.update(f"|{chunk.offset}:{len(chunk)}|".encode())
            for buf in chunk.buffers():
                h.update(b"-" if buf is None else memoryview(buf))
    return BlockDigest(table.num_rows, h.hexdigest(), table.schema)


def _write_block(plan: WritePlan, first_part: int, pieces: int, table: pa.Table) -> list[dict]:
    """Write one block as ``pieces`` row-balanced parts numbered from ``first_part``; their stats."""
    table = _for_writer(table)
    bounds = np.linspace(0, table.num_rows, pieces + 1).astype(int)
    return [write_part(plan, first_part + i, [table.slice(bounds[i], bounds[i + 1] - bounds[i])])
            for i in range(pieces)]


def split_counts(rows: Sequence[int], num_proc: int) -> list[int]:
    """Parts per block: one each, or (fewer blocks than ``num_proc``) ``num_proc`` parts shared by rows."""
    filled = [i for i, r in enumerate(rows) if r > 0]
    if len(filled) >= num_proc or not filled:
        return [1] * len(rows)
    total = sum(rows)
    share = {i: max(1, rows[i] * num_proc // total) for i in filled}
    by_rest = sorted(filled, key=lambda i: -(rows[i] * num_proc / total - share[i]))
    for i in by_rest[: max(0, num_proc - sum(share.values()))]:
        share[i] += 1
    return [min(share.get(i, 1), max(1, r)) for i, r in enumerate(rows)]


def materialize_timeout() -> float:
    """``HORA_RAY_MATERIALIZE_TIMEOUT`` or the default, in seconds.

    Raises:
        ConfigError: the variable is not a positive number.
    """
    return float(settings.get(ENV_MATERIALIZE_TIMEOUT))


def gather(ray: Any, refs: list[Any], what: str, timeout: float | None = None) -> list[Any]:
    """The values of ``refs`` in order, failing at the first failed task, or when no task
    finishes for ``timeout`` seconds (default :func:`materialize_timeout`).

    Raises:
        StoreError: no progress in time (names the pending blocks and the free resources),
            or a task failed with an error that is not hora's.
        HoraError: a task raised one of hora's errors (DataError for bad data...), re-raised.
    """
    from ray.exceptions import RayError, RayTaskError

    timeout = materialize_timeout() if timeout is None else timeout
    index = {ref: i for i, ref in enumerate(refs)}
    values: dict[int, Any] = {}
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not ready:
                raise StoreError(
                    f"{what}: {len(pending)} of {len(refs)} Ray task(s) (blocks {sorted(index[r] for r in pending)[:8]}) "
                    f"did not finish within {timeout:g} s of the last one; the cluster has "
                    f"{ray.available_resources()} free (other jobs hold it?); set {ENV_MATERIALIZE_TIMEOUT} to wait "
                    "longer")
            values[index[ready[0]]] = ray.get(ready[0])
    except RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, HoraError):
            raise cause from exc
        raise StoreError(f"{what}: a Ray task failed: {cause or exc}") from exc
    except RayError as exc:
        raise StoreError(f"{what}: {exc}") from exc
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
    return [values[i] for i in range(len(refs))]


def _probe(store: Store, path: str, token: str) -> str:
    """In a Ray task: read the driver's probe file, write the answer next to it; '' or the error."""
    try:
        with retry.limited(store_timeout() / 2):  # answer with the store's own error within the wait
            if store.read_bytes(path).decode("utf-8", "replace") != token:
                return f"a Ray task reads different content at {store.url_for(path)}"
            store.write_bytes(path + ".ack", token.encode())
        return ""
    except Exception as exc:  # reported to the driver as text
        return f"{type(exc).__name__}: {exc}"


def check_tasks_reach(ray: Any, store: Store) -> None:
    """One tiny Ray task reads a file the driver wrote to ``store`` and writes one back.

    Raises:
        StoreError: the tasks cannot use the store, or see other files than the driver (a
            ``file://`` folder that exists on each node separately); names the store URL.
    """
    token = uuid.uuid4().hex
    path = join(store.root, PROBE_PREFIX + token)
    store.write_bytes(path, token.encode())
    try:
        ref = ray.remote(num_cpus=0.01, max_retries=0)(_probe).remote(store, path, token)
        timeout = 2 * store_timeout() + 30
        ready, _ = ray.wait([ref], timeout=timeout)
        if ready:
            error = gather(ray, [ref], f"checking that Ray tasks reach {store.url}")[0]
        else:
            ray.cancel(ref, force=True)
            error = f"no answer within {timeout:.0f} s (set {ENV_STORE_TIMEOUT} to wait longer)"
        if not error:
            error = probe_answer_error(store, path, token, "the task")
    finally:
        remove_probe(store, path)
    if error:
        raise StoreError(f"Ray tasks cannot use the store {store.url}: {error}. Use a store every Ray node reaches "
                         "and sees the same files in (an object store, or a folder shared by every node)")


def _single_node(ray: Any) -> bool:
    me = ray.get_runtime_context().get_node_id()
    return all(n.get("NodeID") == me for n in ray.nodes() if n.get("Alive"))


class RaySource(Source):
    """A ``ray.data.Dataset`` (see the module docstring)."""

    kind = "ray"
    description = "a Ray Dataset"
    noun = "Ray Dataset"
    launcher = "ray"

    def __init__(self, ds: Any) -> None:
        import ray

        self.ray = ray
        self.ds = ds
        self.kinds: dict[str, str] = {}
        self._cols: list[str] | None = None
        self._blocks: list[Any] = []
        self._digests: list[BlockDigest] = []

    @property
    def frame(self) -> Any:
        return self.ds

    def columns(self) -> list[str]:
        names = self.ds.columns()
        if names is None:
            raise DataError("the Ray Dataset has no schema (it has no blocks)")
        return [str(c) for c in names]

    def string_columns(self, columns):
        sample = self.head(list(columns), 1)
        return [c for c in columns if len(sample[c]) and isinstance(sample[c][0], str)]

    def head(self, columns, rows):
        """The first ``rows`` rows of ``columns`` as a numpy batch (one array or sequence per column).

        Raises:
            DataError: the dataset is empty.
        """
        try:
            batch = self.ds.select_columns(list(columns)).take_batch(rows, batch_format="numpy")
        except ValueError as exc:
            if "empty" not in str(exc):
                raise
            raise DataError("the Ray Dataset is empty: nothing to train on") from exc  # Ray's "The dataset is empty."
        if not batch or len(next(iter(batch.values()))) == 0:
            raise DataError("the Ray Dataset is empty: nothing to train on")
        return batch

    def _execute(self, cols: list[str]) -> None:
        """Run the dataset's pipeline once for ``cols``; hash its blocks where they are."""
        if self._cols == cols:
            return
        self._blocks = list(self.ds.select_columns(cols).to_arrow_refs())
        digest = self.ray.remote(num_cpus=0.25)(_digest)
        self._digests = gather(self.ray, [digest.remote(b) for b in self._blocks], "hashing the Ray Dataset's blocks")
        self._cols = cols

    def check_schema(self, stored, label_cols, weight, val_col):
        all_cols = stored + ([val_col] if val_col else [])
        names = self.ds.columns()
        if names is None:
            raise DataError("the Ray Dataset has no schema (it has no blocks): nothing to train on")
        missing = [c for c in all_cols if c not in names]
        if missing:
            raise DataError(f"column(s) {missing} not found in the Ray Dataset; it has {list(names)}")
        self._execute(all_cols)
        filled = [d.schema for d in self._digests if d.rows] or [d.schema for d in self._digests]
        if not filled or not any(d.rows for d in self._digests):
            raise DataError("the Ray Dataset is empty (0 rows)")
        kinds = {c: arrow_kind(c, filled[0].field(c).type) for c in all_cols}
        for schema in filled[1:]:
            for c in all_cols:
                if kinds[c] != arrow_kind(c, schema.field(c).type):
                    raise DataError(f"column {c!r} has type {filled[0].field(c).type} in one block of the Ray "
                                    f"Dataset and {schema.field(c).type} in another")
        self.kinds = stored_kinds(kinds, val_col, weight)

    def data_token(self, cols):
        self._execute(list(cols))
        return json.dumps({"rows": sum(d.rows for d in self._digests), "cols": list(cols),
                           "blocks": sorted(d.digest for d in self._digests)})

    def write(self, plan, num_proc, describe):
        self._execute(list(plan.columns) + ([plan.val_col] if plan.val_col else []))
        counts = split_counts([d.rows for d in self._digests], num_proc)
        firsts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
        logger.info("%s: %d Ray block(s) -> %d part(s)", describe, len(self._blocks), sum(counts))
        if plan.store.protocol == "memory":
            # memory:// lives in this process only: fetch each block here and write it
            out: list[dict] = []
            for block, first, pieces in zip(self._blocks, firsts, counts):
                out.extend(_write_block(plan, first, pieces, self.ray.get(block, timeout=materialize_timeout())))
            return out
        if not _single_node(self.ray):
            check_tasks_reach(self.ray, plan.store)
        task = self.ray.remote(_write_block).options(name=f"hora-materialize-{plan.attempt}")
        refs = [task.remote(plan, first, pieces, block) for block, first, pieces in zip(self._blocks, firsts, counts)]
        return [stats for part in gather(self.ray, refs, describe) for stats in part]


__all__ = ["RaySource", "BlockDigest", "arrow_kind", "is_ray_dataset", "check_tasks_reach", "gather", "split_counts",
           "ENV_MATERIALIZE_TIMEOUT", "DEFAULT_MATERIALIZE_TIMEOUT"]
