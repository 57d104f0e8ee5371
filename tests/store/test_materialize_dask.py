"""Materialization of Dask DataFrames (one LocalCluster with 2 worker processes)."""

import dask
import numpy as np
import pandas as pd
import pytest

from hora.errors import DataError
from hora.store import ColumnSpec, Store, make_reader, materialize

pytestmark = [pytest.mark.dask, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def ddf():
    import dask.dataframe as dd

    n = 400
    rng = np.random.default_rng(1)
    pdf = pd.DataFrame(
        {
            "id": np.arange(n, dtype=np.int64),
            "x": rng.random(n),
            "vec": list(rng.random((n, 3)).astype(np.float32)),
            "y": rng.integers(0, 2, n),
            "is_val": (np.arange(n) % 4 == 0).astype(np.int64),
            "text": ["t"] * n,
        }
    )
    # object columns holding arrays must stay objects (Dask would turn them into strings)
    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_pandas(pdf, npartitions=3)


def ids(store, info, split):
    return np.concatenate([b["id"] for b in make_reader(store, info, split=split, batch_size=64, shuffle=False)])


def test_arrays_scalars_validation_and_reuse(dask_client, ddf, file_store):
    info = materialize(ddf, file_store, ["x", "vec", "id"], ["y"], validation="is_val", num_proc=4)
    assert info.source == "dask"
    assert info.columns["vec"] == ColumnSpec("float32", (3,)) and info.columns["x"] == ColumnSpec("float64", ())
    assert (info.train_rows, info.val_rows) == (300, 100)
    assert len(info.files["train"]) >= 4 and len(info.files["val"]) >= 4
    np.testing.assert_array_equal(np.sort(ids(file_store, info, "val")), np.arange(0, 400, 4))
    again = materialize(ddf, file_store, ["x", "vec", "id"], ["y"], validation="is_val", num_proc=4)
    assert again.reused and again.fingerprint == info.fingerprint
    other = materialize(ddf[ddf.id > 10], file_store, ["x", "vec", "id"], ["y"], validation="is_val", num_proc=4)
    assert not other.reused and other.fingerprint != info.fingerprint
    frac = materialize(ddf, file_store, ["x", "vec", "id"], ["y"], validation=0.3, num_proc=2)
    assert frac.fingerprint != info.fingerprint and 60 < frac.val_rows < 180
    both = np.sort(np.concatenate([ids(file_store, frac, "train"), ids(file_store, frac, "val")]))
    np.testing.assert_array_equal(both, np.arange(400))


def test_workers_write_to_s3_and_memory_collects(dask_client, ddf, s3_store):
    info = materialize(ddf, s3_store, ["vec", "id"], ["y"], num_proc=2)
    np.testing.assert_array_equal(np.sort(ids(s3_store, info, "train")), np.arange(400))
    mem = Store.create("memory://dask-mem")
    info = materialize(ddf, mem, ["vec", "id"], ["y"], num_proc=2)
    np.testing.assert_array_equal(np.sort(ids(mem, info, "train")), np.arange(400))


def test_bad_input(dask_client, ddf, file_store):
    with pytest.raises(DataError, match="label column 'text' holds string"):
        materialize(ddf, file_store, ["y"], ["text"])
    with pytest.raises(DataError, match=r"\['nope'\] not found"):
        materialize(ddf, file_store, ["nope"], ["y"])
    with pytest.raises(DataError, match="validation column 'x'"):
        materialize(ddf, file_store, ["vec"], ["y"], validation="x")
