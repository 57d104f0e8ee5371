"""A Horovod Spark user's estimator code on hora: Horovod's Store classes and paths, prepare_data +
fit_on_parquet, a model built by hand, resuming a run_id, the legacy Lightning module, input_shapes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from hora.errors import ConfigError, DataError

pytestmark = pytest.mark.timeout(180)


class XOR(torch.nn.Module):
    def __init__(self, output_dim: int = 1):
        super().__init__()
        self.lin1 = torch.nn.Linear(2, 8)
        self.lin2 = torch.nn.Linear(8, output_dim)

    def forward(self, features):
        return torch.sigmoid(self.lin2(torch.tanh(self.lin1(features.float()))))


class InProcessBackend:
    """Horovod's Backend interface (run, num_processes), running the function in this process."""

    def __init__(self):
        self.calls = 0

    def run(self, fn, args=(), kwargs={}, env={}):
        self.calls += 1
        return [fn(*args, **kwargs)] * self.num_processes()

    def num_processes(self):
        return 1


def test_horovod_store_classes_are_constructors_of_the_one_store(tmp_path, monkeypatch):
    import hora.spark.common.store as hs
    from hora.store import DBFSLocalStore, FilesystemStore, HDFSStore, LocalStore, Store

    assert hs.LocalStore is LocalStore and hs.HDFSStore is HDFSStore and hs.Store is Store
    store = LocalStore(str(tmp_path / "s"))
    assert type(store) is Store and FilesystemStore(f"file://{tmp_path}/f").url == f"file://{tmp_path}/f"
    assert store.get_checkpoint_path("run01") == f"file://{tmp_path}/s/runs/run01/checkpoints"
    assert store.get_logs_path("run01") == f"file://{tmp_path}/s/runs/run01/logs"
    assert store.get_run_path("run01") == f"file://{tmp_path}/s/runs/run01"
    assert store.get_checkpoint_filename(3) == "epoch-000003.ckpt" and not store.exists(store.get_run_path("run01"))
    store.write_text("notes/a.txt", "héllo")
    assert store.read("notes/a.txt") == "héllo".encode() and store.exists(f"file://{tmp_path}/s/notes/a.txt")
    assert not store.is_parquet_dataset("notes")
    with pytest.raises(DataError, match=r"prepared/latest.json does not exist"):
        store.get_train_data_path()
    for kwargs, name in (({"train_path": "/x"}, "train_path"), ({"save_runs": False}, "save_runs"),
                         ({"checkpoint_filename": "c"}, "checkpoint_filename"), ({"bogus": 1}, "bogus")):
        with pytest.raises(ConfigError, match=name):
            LocalStore(str(tmp_path / "t"), **kwargs)
    with pytest.raises(ConfigError, match="not a local path"):
        LocalStore("s3://bucket/x")
    with pytest.raises(ConfigError, match=r"driver='libhdfs3'"):
        HDFSStore("hdfs://nn:8020/user/x", driver="libhdfs3")
    monkeypatch.delenv("ARROW_LIBHDFS_DIR", raising=False)
    monkeypatch.setenv("HADOOP_HOME", str(tmp_path))  # no lib/native/libhdfs.so there
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match=r"driver='libhdfs'.*libhdfs.so"):
        HDFSStore("/user/x", host="nn", port=8020)
    with pytest.raises(ConfigError, match="not a DBFS path"):
        DBFSLocalStore("/tmp/x")


def test_horovod_module_paths_import_and_internals_say_what_hora_does():
    import hora.spark
    from hora.common.util import gloo_built, mpi_built, nccl_built
    from hora.runner.common.util.secret import make_secret_key
    from hora.runner.mpi_run import is_open_mpi
    from hora.runner.util.threads import in_thread
    from hora.spark.common import constants
    from hora.spark.common.backend import SparkBackend
    from hora.spark.common.util import prepare_data, to_petastorm_fn
    from hora.spark.lightning.legacy import to_lightning_module
    from hora.spark.torch import remote
    from hora.spark.torch.estimator import EstimatorParams, TorchEstimator, TorchModel

    assert TorchEstimator is hora.spark.TorchEstimator and TorchModel is hora.spark.TorchModel
    assert callable(hora.spark.run_elastic) and callable(prepare_data) and callable(to_lightning_module)
    assert EstimatorParams.backend.name == "backend" and issubclass(TorchEstimator, EstimatorParams)
    assert gloo_built() is True and isinstance(mpi_built(), bool) and isinstance(nccl_built(), int)
    assert isinstance(is_open_mpi(), bool) and len(make_secret_key()) == 32 and SparkBackend is not None
    assert constants.TOTAL_BUFFER_MEMORY_CAP_GIB == 4 and in_thread(lambda: None).join() is None
    with pytest.raises(NotImplementedError, match=r"remote._metric_cls is an internal of Horovod.*metrics"):
        remote._metric_cls()
    with pytest.raises(NotImplementedError, match="to_petastorm_fn.*plain Parquet"):
        to_petastorm_fn(["features"], {})
    with pytest.raises(AttributeError):
        remote.not_a_horovod_name  # noqa: B018


def test_legacy_lightning_module_weighs_losses_as_horovod():
    pytest.importorskip("lightning")
    from hora.spark.lightning.legacy import to_lightning_module

    def diff(output, label, reduction=None):
        losses = label - output
        return losses if reduction == "none" else losses.mean()

    def total(output, label, reduction=None):
        losses = label + output
        return losses if reduction == "none" else losses.mean()

    base = dict(model=XOR(), optimizer=None, feature_cols=["features"], sample_weights_col="w")
    labels, outputs = torch.tensor([[2.0, 4.0, 6.0]]), torch.tensor([[1.0, 1.0, 1.0]])
    module = to_lightning_module(loss_fns=[diff], loss_weights=[2.0], label_cols=["a"], **base)
    assert module._calculate_loss(outputs, labels) == pytest.approx(2.0 * 3.0)
    # per-row losses 1, 3, 5 times weights 2, 0, 1: their mean (not divided by the weights' sum)
    assert module._calculate_loss(outputs, labels, sample_weights=torch.tensor([2.0, 0.0, 1.0])) == pytest.approx(
        2.0 * (2 + 0 + 5) / 3)
    two = to_lightning_module(loss_fns=[diff, total], loss_weights=[0.5, 0.25], label_cols=["a", "b"], **base)
    labels2, outputs2 = torch.tensor([[2.0, 4.0], [1.0, 1.0]]), torch.tensor([[1.0, 1.0], [1.0, 3.0]])
    assert two._calculate_loss(outputs2, labels2) == pytest.approx(0.5 * 2.0 + 0.25 * 3.0)
    with pytest.raises(ConfigError, match="one of each per label"):
        to_lightning_module(loss_fns=[diff], loss_weights=[1.0, 2.0], label_cols=["a"], **base)


@pytest.mark.spark
@pytest.mark.timeout(420)
def test_prepare_data_fit_on_parquet_resume_and_a_model_built_by_hand(spark, tmp_path):
    from pyspark.ml.linalg import Vectors, VectorUDT

    import hora.spark.torch as hvd_spark
    from hora.spark.common import util
    from hora.store import LocalStore

    rows = [(Vectors.dense([a, b]), float(a ^ b), 0.25 * (1 + i % 4), i % 2) for i, (a, b) in
            enumerate([(0, 0), (0, 1), (1, 0), (1, 1)] * 2)]
    df = spark.createDataFrame(rows, ["features", "y", "weight", "val"])
    store = LocalStore(str(tmp_path / "store"))
    backend = InProcessBackend()
    with util.prepare_data(backend.num_processes(), store, df, feature_columns=["features"], label_columns=["y"],
                           validation="val", sample_weight_col="weight") as idx:
        assert store.get_train_data_path(idx) == store.get_train_data_path()
        assert store.is_parquet_dataset(store.get_train_data_path(idx)) and store.exists(store.get_val_data_path())
        model = XOR()
        est = hvd_spark.TorchEstimator(
            backend=backend, store=store, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            loss=F.binary_cross_entropy, input_shapes=[[2]], feature_cols=["features"], label_cols=["y"],
            sample_weight_col="weight", validation="val", batch_size=1, epochs=1, run_id="run01",
            reader_pool_type="process", verbose=0)
        ckpt = store.get_checkpoint_path("run01")
        assert not store.exists(ckpt)
        fitted = est.fit_on_parquet(dataset_idx=idx)
        assert store.exists(ckpt) and backend.calls == 1 and len(fitted.getHistory()) == 1
        assert fitted.getModel()(torch.ones([1, 2], dtype=torch.int32)).dtype == torch.float32
        assert fitted.transform(df).count() == df.count()
    read = []
    est._load_checkpoint = lambda run_id: read.append(run_id) or store.latest_checkpoint(run_id)
    est.fit_on_parquet(params={est.epochs: 2})  # the latest prepared dataset; resumes run01 at epoch 2
    assert read == ["run01"] and store.list_checkpoints("run01") == [0, 1]
    with pytest.raises(DataError, match=r"prepared/7.json"):
        est.fit_on_parquet(dataset_idx=7)
    with pytest.raises(ConfigError, match="reader_pool_type"):
        est.copy({est.reader_pool_type: "threads"}).fit_on_parquet()

    from pyspark.sql.types import DoubleType

    from hora.spark.common import constants

    metadata = util._get_metadata(df)
    assert metadata["features"] == {"spark_data_type": type(rows[0][0]), "is_sparse_vector_only": False, "shape": 2,
                                    "intermediate_format": constants.ARRAY, "max_size": 2}
    assert metadata["y"]["spark_data_type"] is DoubleType and metadata["y"]["intermediate_format"] == constants.NOCHANGE
    by_hand = hvd_spark.TorchModel(history=None, model=XOR(output_dim=2), input_shapes=[[2]],
                                   feature_columns=["features"], label_columns=["y"], optimizer=None,
                                   _metadata=metadata)
    assert by_hand.getFeatureColumns() == ["features"] and by_hand.getLabelColumns() == ["y"]
    assert by_hand._get_metadata() is metadata
    from hora.estimators.faces.horovod import vector_labels

    assert vector_labels(df, ["features"]) and not vector_labels(df, ["y"])  # a vector label: vector predictions
    out = by_hand.transform(df.select("features", "y"))
    assert [type(f.dataType) for f in out.schema.fields][-1] is VectorUDT and out.columns[-1] == "y__output"
    got = np.array([r.y__output.toArray() for r in out.orderBy("y").collect()])
    expected = by_hand.getModel()(torch.tensor(np.array([r.features.toArray() for r in out.orderBy("y").collect()])))
    assert np.allclose(got, expected.detach().numpy(), atol=1e-6)


@pytest.mark.timeout(240)
def test_lightning_plain_module_with_the_default_logger(tmp_path):
    """Horovod's legacy path (a torch module with optimizer= and loss=) and logger=None: a TensorBoard
    logger in the run's logs folder, so LearningRateMonitor works."""
    pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import LearningRateMonitor

    from hora.dask import LightningEstimator
    from hora.store import LocalStore

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"features": list(rng.random((32, 2)).astype("float32")),
                       "y": rng.integers(0, 2, 32).astype("float32"), "weight": rng.random(32).astype("float32")})
    store = LocalStore(str(tmp_path / "store"))
    model = XOR()
    est = LightningEstimator(num_proc=1, store=store, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                             loss=F.binary_cross_entropy, feature_cols=["features"], label_cols=["y"],
                             sample_weight_col="weight", batch_size=8, epochs=2, run_id="legacy", log_every_n_steps=1,
                             callbacks=[LearningRateMonitor(logging_interval="step")], verbose=0)
    fitted = est.fit(df)
    assert [sorted(h) for h in fitted.history_] == [["data_wait", "epoch", "loss", "lr-SGD", "train_loss"]] * 2  # the monitor logs
    assert fitted.model_.model.lin1.weight.shape == (8, 2)  # the wrapped module, trained
    logs = store.get_logs_path("legacy")[len("file://"):]
    events = [p for p in (tmp_path / "store").rglob("events.out.tfevents.*") if str(p).startswith(logs)]
    assert events, f"no TensorBoard events in {logs}"
    data = b"".join(p.read_bytes() for p in events)
    assert b"lr-SGD" in data and b"train_loss" in data


def test_reader_pool_type_process_reads_the_same_batches_in_worker_processes(tmp_path):
    from hora.store import Store, make_reader, materialize
    from hora.store.process_reader import ProcessPool

    store = Store.create(str(tmp_path / "store"))
    info = materialize(pd.DataFrame({"x": np.arange(200, dtype="float32"), "y": np.arange(200) % 3}), store,
                       feature_cols=["x"], label_cols=["y"], num_proc=4)
    pool = ProcessPool(2, "spawn")
    try:
        for rank in (0, 1):
            plain = make_reader(store, info, rank=rank, size=2, batch_size=16, epoch=1, shuffle=True)
            pooled = make_reader(store, info, rank=rank, size=2, batch_size=16, epoch=1, shuffle=True)
            pooled.read_pool = pool
            got, want = list(pooled), list(plain)
            assert len(got) == len(want) == len(plain)
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a["x"], b["x"])
        assert pool._executor is not None and len(pool._executor._processes) == 2  # read in worker processes
    finally:
        pool.close()
    with pytest.raises(ConfigError, match="mp_start_method"):
        ProcessPool(2, "vfork")
