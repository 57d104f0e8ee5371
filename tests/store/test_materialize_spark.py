"""Materialization of Spark DataFrames, on the classic session (local[2]) and on a Spark Connect
session (a real Connect server, local[2]): every test runs on both, with the same assertions."""

import uuid

import numpy as np
import pytest

from hora import _spark
from hora.errors import DataError, StoreError
from hora.store import ColumnSpec, Store, load_dataset_info, make_reader, materialize

from .conftest import S3_BUCKET

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


@pytest.fixture(scope="module", params=["classic", "connect"])
def session(request):
    """The classic ``spark`` session, then the Connect ``connect_spark`` session."""
    return request.getfixturevalue("spark" if request.param == "classic" else "connect_spark")


@pytest.fixture(scope="module")
def sdf(session):
    from pyspark.ml.linalg import Vectors

    rows = [
        (
            i,
            float(i),
            Vectors.sparse(4, [i % 4], [float(i)]) if i % 2 else Vectors.dense([float(i), 0.0, 1.0, 2.0]),
            [float(i), 2.0],
            [[i, 1], [2, 3], [4, 5]],
            i % 3,
            i % 5 == 0,
            "s",
            {"k": 1},
            float("nan") if i == 7 else float(i),
        )
        for i in range(120)
    ]
    df = session.createDataFrame(rows, ["id", "x", "vec", "arr", "nested", "y", "is_val", "text", "mapping", "ynan"])
    if not _spark.is_connect(session):
        from pyspark.ml.feature import VectorAssembler

        return VectorAssembler(inputCols=["x", "vec"], outputCol="assembled").transform(df).repartition(3)
    # pyspark.ml's classic stages need the process-wide Connect flag, which this test process (holding a
    # classic session too) cannot set: build VectorAssembler's output from Connect column functions
    from pyspark.ml.connect.functions import array_to_vector
    from pyspark.sql.connect import functions as F

    assembled = array_to_vector(F.concat(F.array(F.col("x")), _spark.vector_to_array(df, F.col("vec"), "float64")))
    return df.withColumn("assembled", assembled).repartition(3)


def read_all(store, info, split="train"):
    batches = list(make_reader(store, info, split=split, batch_size=50, shuffle=False, prefetch=0))
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def test_vectors_arrays_and_scalars(sdf, file_store):
    info = materialize(sdf, file_store, ["x", "vec", "assembled", "arr", "nested"], ["y"], num_proc=2, seed=3,
                       validation=0.25)
    assert info.source == "spark" and info.train_rows + info.val_rows == 120 and info.val_rows > 0
    assert info.columns["vec"] == ColumnSpec("float32", (4,))
    assert info.columns["assembled"] == ColumnSpec("float32", (5,))
    assert info.columns["arr"] == ColumnSpec("float64", (2,))
    assert info.columns["nested"] == ColumnSpec("int64", (3, 2))
    assert info.columns["x"] == ColumnSpec("float64", ()) and info.columns["y"] == ColumnSpec("int64", ())
    assert len(info.files["train"]) >= 2 and len(info.files["val"]) >= 2
    got = {k: np.concatenate([read_all(file_store, info, s)[k] for s in ("train", "val")]) for k in info.columns}
    order = np.argsort(got["x"])
    ids = got["x"][order].astype(int)
    np.testing.assert_array_equal(ids, np.arange(120))
    for i, vec, asm, nested in zip(ids, got["vec"][order], got["assembled"][order], got["nested"][order]):
        want = np.zeros(4, np.float32)
        if i % 2:
            want[i % 4] = i
        else:
            want[:] = [i, 0, 1, 2]
        np.testing.assert_array_equal(vec, want)  # sparse and dense vectors become dense arrays
        np.testing.assert_array_equal(asm, np.concatenate([[i], want]).astype(np.float32))
        np.testing.assert_array_equal(nested, [[i, 1], [2, 3], [4, 5]])


def test_reuse_validation_column_and_invalidation(sdf, file_store):
    a = materialize(sdf, file_store, ["x", "vec"], ["y"], validation="is_val", num_proc=2)
    assert a.val_rows == 24 and "is_val" not in a.columns
    b = materialize(sdf, file_store, ["x", "vec"], ["y"], validation="is_val", num_proc=2)
    assert b.reused and b.fingerprint == a.fingerprint and b.train_files == a.train_files
    c = materialize(sdf, file_store, ["x", "vec"], ["y"], validation=0.1, num_proc=2)
    assert not c.reused and c.fingerprint != a.fingerprint
    d = materialize(sdf.filter("id > 5"), file_store, ["x", "vec"], ["y"], validation="is_val", num_proc=2)
    assert not d.reused and d.fingerprint != a.fingerprint and d.train_rows + d.val_rows == 114
    assert load_dataset_info(file_store, a.fingerprint) is not None


def test_spark_reads_the_materialized_parquet_back(session, sdf, file_store):
    info = materialize(sdf, file_store, ["vec", "nested"], ["y"], num_proc=2)
    back = session.read.parquet(file_store.layout.train_dir(info.fingerprint))
    assert back.count() == 120
    assert back.schema["vec"].dataType.simpleString() == "array<float>"
    assert back.schema["nested"].dataType.simpleString() == "array<array<bigint>>"


def test_fewer_partitions_than_processes(sdf, file_store):
    info = materialize(sdf.coalesce(1), file_store, ["x"], ["y"], num_proc=3)
    assert len(info.files["train"]) >= 3 and info.train_rows == 120


def test_bad_input_fails_before_writing(sdf, file_store):
    with pytest.raises(DataError, match="label column 'text' holds string"):
        materialize(sdf, file_store, ["x"], ["text"])
    with pytest.raises(DataError, match="'mapping' has Spark type map"):
        materialize(sdf, file_store, ["mapping"], ["y"])
    with pytest.raises(DataError, match=r"\['nope'\] not found"):
        materialize(sdf, file_store, ["nope"], ["y"])
    assert file_store.listdir(file_store.layout.datasets_dir()) == []  # nothing written for bad schemas
    with pytest.raises(DataError, match="validation column 'x' must hold|validation column"):
        materialize(sdf, file_store, ["vec"], ["y"], validation="x")
    with pytest.raises(DataError, match=r"'ynan': 1 of 120 rows"):
        materialize(sdf, file_store, ["x"], ["ynan"])
    with pytest.raises(DataError, match="empty"):
        materialize(sdf.limit(0), file_store, ["x"], ["y"])
    # bad data is found while writing: the attempt leaves nothing behind (no commit, no staging, no lease)
    left = [e for d in file_store.listdir(file_store.layout.datasets_dir()) for e in file_store.listdir(d)]
    assert left == []


def test_spark_executors_write_to_s3(sdf, s3_store):
    info = materialize(sdf, s3_store, ["vec", "x"], ["y"], num_proc=2, validation=0.2)
    assert info.train_rows + info.val_rows == 120
    assert all(s3_store.exists(p) for p in info.train_files + info.val_files)
    got = read_all(s3_store, info)
    assert got["vec"].shape == (info.train_rows, 4)


def test_memory_store_collects_to_the_driver(sdf):
    store = Store.create(f"memory://spark-mem-{uuid.uuid4().hex[:8]}")
    info = materialize(sdf, store, ["vec"], ["y"], num_proc=2)
    assert info.train_rows == 120 and len(info.files["train"]) == 2
    assert read_all(store, info)["vec"].shape == (120, 4)


def test_a_store_the_executors_cannot_reach_fails_before_writing(sdf, s3_endpoint, monkeypatch):
    # s3fs finds the endpoint in this process's environment only: the driver reaches the store,
    # the executors (their Python workers started before) try the real AWS and cannot
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    url = f"s3://{S3_BUCKET}/unreachable-{uuid.uuid4().hex[:8]}"
    store = Store.create(url, skip_instance_cache=True)
    with pytest.raises(StoreError, match=rf"the Spark executors cannot use the store {url}: .*Could not connect"):
        materialize(sdf, store, ["x"], ["y"], num_proc=2)
    assert store.listdir(store.layout.datasets_dir()) == []  # nothing was written
