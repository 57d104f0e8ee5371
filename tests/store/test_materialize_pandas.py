"""Materialization of pandas frames: content, splits, fingerprints, atomic commit, bad input."""

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hora.errors import ConfigError, DataError
from hora.store import ColumnSpec, DatasetInfo, Store, load_dataset_info, make_reader, materialize

from .faults import delayed_commit_code

pytestmark = pytest.mark.timeout(60)


def frame(n=200, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "id": np.arange(n, dtype=np.int64),
            "x": rng.random(n).astype(np.float32),
            "vec": list(rng.random((n, 3))),
            "img": list(rng.random((n, 2, 2)).astype(np.float32)),
            "flag": rng.random(n) < 0.5,
            "y": rng.integers(0, 3, n),
            "w": rng.random(n),
            "is_val": (np.arange(n) % 4 == 0),
            "is_val01": (np.arange(n) % 5 == 0).astype(np.int64),
            "text": ["a"] * n,
        }
    )


def read_all(store, info, split="train"):
    batches = list(make_reader(store, info, split=split, batch_size=64, shuffle=False, prefetch=0))
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def test_columns_shapes_and_values_round_trip(any_store):
    df = frame()
    info = materialize(df, any_store, ["x", "vec", "img", "flag"], ["y"], sample_weight_col="w", num_proc=2)
    assert info.columns == {
        "x": ColumnSpec("float32", ()),
        "vec": ColumnSpec("float64", (3,)),
        "img": ColumnSpec("float32", (2, 2)),
        "flag": ColumnSpec("bool", ()),
        "y": ColumnSpec("int64", ()),
        "w": ColumnSpec("float64", ()),
    }
    assert "text" not in info.columns and "id" not in info.columns  # only the needed columns
    assert (info.train_rows, info.val_rows, info.reused, info.source) == (200, 0, False, "pandas")
    got = read_all(any_store, info)
    np.testing.assert_array_equal(got["x"], df["x"].to_numpy())
    np.testing.assert_array_equal(got["vec"], np.stack(df["vec"]))
    np.testing.assert_array_equal(got["img"], np.stack(df["img"]))
    np.testing.assert_array_equal(got["flag"], df["flag"].to_numpy())
    np.testing.assert_array_equal(got["y"], df["y"].to_numpy())


def test_files_are_balanced_plain_parquet_with_a_committed_sidecar(file_store):
    info = materialize(frame(203), file_store, ["x", "vec", "img"], ["y"], num_proc=4, rows_per_row_group=16)
    rows = [f.rows for f in info.files["train"]]
    assert len(rows) == 4 and max(rows) - min(rows) <= 1
    for f in info.files["train"]:
        assert all(r <= 16 for r in f.row_groups) and sum(f.row_groups) == f.rows
    layout = file_store.layout
    assert file_store.exists(layout.commit_marker(info.fingerprint))
    meta = json.loads(file_store.read_bytes(layout.metadata_path(info.fingerprint)))
    assert meta["rows"] == {"train": 203, "val": 0}
    assert {c["name"]: c["shape"] for c in meta["columns"]}["img"] == [2, 2]
    # plain Parquet: list columns (not fixed-size or large lists), readable as one dataset
    table = pq.read_table(layout.train_dir(info.fingerprint))
    assert table.num_rows == 203
    assert table.schema.field("vec").type == pa.list_(pa.float64())
    assert table.schema.field("img").type == pa.list_(pa.list_(pa.float32()))
    assert [p.rsplit("/", 1)[-1].startswith("part-") for p in info.train_files] == [True] * 4
    assert not [e for e in file_store.listdir(layout.dataset_dir(info.fingerprint)) if "_tmp-" in e]


def test_validation_fraction_is_seeded(file_store):
    df = frame(1000)
    a = materialize(df, file_store, ["x"], ["y"], validation=0.25, seed=1, num_proc=2)
    assert 180 < a.val_rows < 320 and a.train_rows + a.val_rows == 1000
    assert len(a.files["val"]) >= 2
    b = materialize(df, file_store, ["x"], ["y"], validation=0.25, seed=1, num_proc=2, overwrite=True)
    assert (b.val_rows, b.fingerprint) == (a.val_rows, a.fingerprint)
    c = materialize(df, file_store, ["x"], ["y"], validation=0.25, seed=2, num_proc=2)
    assert c.fingerprint != a.fingerprint
    none = materialize(df, file_store, ["x"], ["y"], validation=0.0)
    assert none.val_rows == 0


@pytest.mark.parametrize("col,expected", [("is_val", 50), ("is_val01", 40)])
def test_validation_column(file_store, col, expected):
    df = frame(200)
    info = materialize(df, file_store, ["x", "id"], ["y"], validation=col, num_proc=2)
    assert info.val_rows == expected and info.train_rows == 200 - expected
    assert col not in info.columns
    val_ids = np.sort(read_all(file_store, info, "val")["id"])
    np.testing.assert_array_equal(val_ids, df["id"][df[col].astype(bool)].to_numpy())


def test_reuse_and_invalidation(file_store):
    df = frame()
    first = materialize(df, file_store, ["x", "vec"], ["y"], validation=0.2, num_proc=2)
    mtimes = {p: os.path.getmtime(p) for p in first.train_files}
    again = materialize(df.copy(), file_store, ["x", "vec"], ["y"], validation=0.2, num_proc=2)
    assert again.reused and again.fingerprint == first.fingerprint
    assert again.train_files == first.train_files
    assert {p: os.path.getmtime(p) for p in again.train_files} == mtimes  # nothing rewritten
    changed = df.copy()
    changed.loc[5, "x"] = 42.0
    assert materialize(changed, file_store, ["x", "vec"], ["y"], validation=0.2, num_proc=2).fingerprint != first.fingerprint
    changed_arr = df.copy()
    changed_arr.at[3, "vec"] = np.zeros(3)
    assert not materialize(changed_arr, file_store, ["x", "vec"], ["y"], validation=0.2, num_proc=2).reused
    for kwargs in (dict(validation=0.3), dict(num_proc=3), dict(label_nan="drop"), dict(sample_weight_col="w")):
        opts = dict(validation=0.2, num_proc=2) | kwargs
        other = materialize(df, file_store, ["x", "vec"], ["y"], **opts)
        assert not other.reused and other.fingerprint != first.fingerprint, kwargs
    assert materialize(df, file_store, ["x"], ["y"], validation=0.2, num_proc=2).fingerprint != first.fingerprint
    forced = materialize(df, file_store, ["x", "vec"], ["y"], validation=0.2, num_proc=2, overwrite=True)
    assert not forced.reused and forced.fingerprint == first.fingerprint
    assert load_dataset_info(file_store, first.fingerprint).train_files == forced.train_files


def test_dataset_info_round_trips(file_store):
    info = materialize(frame(), file_store, ["x", "img"], ["y"], validation=0.2, num_proc=2)
    assert DatasetInfo.from_json(info.to_json()) == info
    assert pickle.loads(pickle.dumps(info)) == info
    assert load_dataset_info(file_store, info.fingerprint) == info


def test_a_dataset_without_a_valid_marker_is_not_reused(file_store):
    df = frame()
    info = materialize(df, file_store, ["x"], ["y"])
    marker = file_store.layout.commit_marker(info.fingerprint)
    file_store.write_bytes(marker, b'{"metadata_sha256": "0000"}')
    assert load_dataset_info(file_store, info.fingerprint) is None
    file_store.rm(marker)
    assert load_dataset_info(file_store, info.fingerprint) is None
    again = materialize(df, file_store, ["x"], ["y"])
    assert not again.reused and load_dataset_info(file_store, info.fingerprint) is not None


KILLED_SCRIPT = delayed_commit_code(60) + textwrap.dedent(
    """
    import sys
    import numpy as np, pandas as pd
    from hora.store import Store, materialize
    n = 5000
    df = pd.DataFrame({"x": np.arange(n, dtype=np.float32), "y": np.arange(n) % 2})
    materialize(df, Store.create(sys.argv[1]), ["x"], ["y"], validation=0.1, num_proc=3, rows_per_row_group=100)
    """
)


@pytest.mark.timeout(120)
def test_materialization_killed_mid_write_is_not_reused(tmp_path):
    url = str(tmp_path / "store")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SCRIPT, url])
    store = Store.create(url)
    try:
        deadline = time.monotonic() + 60
        tmp_files = []
        while time.monotonic() < deadline and proc.poll() is None:
            tmp_files = [str(p) for p in (tmp_path / "store" / "datasets").glob("*/_tmp-*/*/*.parquet")]
            if len(tmp_files) >= 6:
                break
            time.sleep(0.2)
        assert len(tmp_files) >= 6, "the child never wrote its files"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    fp = tmp_files[0].split("/datasets/")[1].split("/")[0]
    assert load_dataset_info(store, fp) is None
    # the next fit with the same data and options rewrites it and commits
    n = 5000
    df = pd.DataFrame({"x": np.arange(n, dtype=np.float32), "y": np.arange(n) % 2})
    info = materialize(df, store, ["x"], ["y"], validation=0.1, num_proc=3, rows_per_row_group=100)
    assert info.fingerprint == fp and not info.reused
    assert info.train_rows + info.val_rows == n
    assert not list((tmp_path / "store" / "datasets" / fp).glob("_tmp-*"))  # the dead attempt is gone
    got = np.sort(np.concatenate([read_all(store, info)["x"], read_all(store, info, "val")["x"]]))
    np.testing.assert_array_equal(got, np.arange(n, dtype=np.float32))


def test_label_nan_error_names_column_and_count(file_store):
    df = frame(100)
    df["yf"] = df["y"].astype(float)
    df.loc[[3, 7, 9], "yf"] = np.nan
    with pytest.raises(DataError, match=r"'yf': 3 of 100 rows"):
        materialize(df, file_store, ["x"], ["yf"])
    assert not file_store.listdir(file_store.layout.datasets_dir()) or all(
        not file_store.exists(file_store.layout.commit_marker(p.rsplit("/", 1)[-1]))
        for p in file_store.listdir(file_store.layout.datasets_dir())
    )
    dropped = materialize(df, file_store, ["x"], ["yf"], label_nan="drop")
    assert dropped.train_rows == 97
    kept = materialize(df, file_store, ["x"], ["yf"], label_nan="keep")
    assert kept.train_rows == 100


def test_nan_inside_array_labels_and_nullable_labels(file_store):
    df = frame(50)
    df["ys"] = [np.array([1.0, np.nan]) if i == 4 else np.array([1.0, 2.0]) for i in range(50)]
    with pytest.raises(DataError, match=r"'ys': 1 of 50"):
        materialize(df, file_store, ["x"], ["ys"])
    df["yn"] = pd.array([None if i in (1, 2) else i for i in range(50)], dtype="Int64")
    with pytest.raises(DataError, match=r"'yn': 2 of 50"):
        materialize(df, file_store, ["x"], ["yn"])


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(feature_cols=["nope", "x"]), DataError, r"\['nope'\] not found"),
        (dict(label_cols=["missing_label"]), DataError, "missing_label"),
        (dict(label_cols=["text"]), DataError, "label column 'text' holds string"),
        (dict(validation=1.0), ConfigError, r"\[0, 1\)"),
        (dict(validation=-0.1), ConfigError, r"\[0, 1\)"),
        (dict(validation=float("nan")), ConfigError, r"\[0, 1\)"),
        (dict(validation="no_such_col"), DataError, "no_such_col"),
        (dict(validation=True), ConfigError, "validation"),
        (dict(num_proc=0), ConfigError, "num_proc"),
        (dict(feature_cols=[]), ConfigError, "feature_cols"),
        (dict(feature_cols=["x", "x"]), ConfigError, "twice"),
        (dict(label_nan="maybe"), ConfigError, "label_nan"),
        (dict(sample_weight_col="vec"), DataError, "sample weight column 'vec'"),
        (dict(validation="x"), ConfigError, "also a feature"),
        (dict(vector_dtype="int8"), ConfigError, "vector_dtype"),
    ],
)
def test_bad_input(file_store, kwargs, error, match):
    args = dict(feature_cols=["x"], label_cols=["y"]) | kwargs
    with pytest.raises(error, match=match):
        materialize(frame(20), file_store, **args)


def test_bad_data(file_store):
    df = frame(40)
    with pytest.raises(DataError, match="empty"):
        materialize(df.iloc[:0], file_store, ["x"], ["y"])
    bad_val = df.copy()
    bad_val.loc[[1, 2], "is_val01"] = 2
    with pytest.raises(DataError, match=r"validation column 'is_val01'.*2 rows"):
        materialize(bad_val, file_store, ["x"], ["y"], validation="is_val01")
    with pytest.raises(DataError, match="validation split is empty"):
        materialize(df.assign(none=False), file_store, ["x"], ["y"], validation="none")
    with pytest.raises(DataError, match="training split is empty"):
        materialize(df.assign(all=True), file_store, ["x"], ["y"], validation="all")
    ragged = df.copy()  # variable-length 1-d arrays are stored (a "ragged" column); nested ones are not
    ragged["r"] = [np.zeros((3 if i % 2 else 4, 2)) for i in range(40)]
    with pytest.raises(DataError, match=r"array column 'r' holds nested arrays of different lengths"):
        materialize(ragged, file_store, ["r"], ["y"])
    nullfeat = df.copy()
    nullfeat["nf"] = pd.array([None] + list(range(39)), dtype="Int64")
    with pytest.raises(DataError, match=r"null values in column\(s\) 'nf': 1"):
        materialize(nullfeat, file_store, ["nf"], ["y"])
    mapcol = df.copy()
    mapcol["m"] = [{"a": 1}] * 40
    with pytest.raises(DataError, match="'m' holds dict"):
        materialize(mapcol, file_store, ["m"], ["y"])
    with pytest.raises(DataError, match="pass a Spark, Dask or pandas DataFrame"):
        materialize([[1, 2]], file_store, ["x"], ["y"])
    with pytest.raises(ConfigError, match="Store"):
        materialize(df, "file:///tmp/x", ["x"], ["y"])
    # nothing half-written is left behind by any failure
    datasets = file_store.layout.datasets_dir()
    for d in file_store.listdir(datasets):
        assert not [e for e in file_store.listdir(d) if "_tmp-" in e]


def test_a_split_with_fewer_files_than_processes_is_recut(any_store):
    df = frame(90)
    df["early"] = df["id"] < 12  # every validation row sits in the first input chunk
    info = materialize(df, any_store, ["x", "id"], ["y"], validation="early", num_proc=3, rows_per_row_group=5)
    assert [f.rows for f in info.files["val"]] == [4, 4, 4]
    assert len(info.files["train"]) == 3
    np.testing.assert_array_equal(np.sort(read_all(any_store, info, "val")["id"]), np.arange(12))
    listed = [p.rsplit("/", 1)[-1] for p in any_store.listdir(any_store.layout.val_dir(info.fingerprint))]
    assert sorted(listed) == sorted(f.path.rsplit("/", 1)[-1] for f in info.files["val"])
