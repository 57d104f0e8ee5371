"""The estimators with ``backend="ray"`` and Ray Datasets, on the real local Ray cluster of conftest.py.

One Torch fit on a pandas frame and one on a Ray Dataset (2 ranks each, every rank's final
weights compared), one Lightning fit through the same seam, the materialization of Ray
Datasets (values, tensor columns, reuse, memory://), and the bad input refused on the
driver before any Ray actor starts.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from hora.errors import ConfigError, DataError
from hora.estimators.callbacks import Callback

torch = pytest.importorskip("torch")


class RankWeights(Callback):
    """Every rank writes the model it ends with to ``<run>/weights-<rank>/<file>`` in the store."""

    def on_train_result(self, ctx, history):
        for name, data in ctx.model_files().items():
            ctx.store.write_bytes(f"{ctx.store.layout.run_dir(ctx.run_id)}/weights-{ctx.rank}/{name}", data)


def _rank_weights(store, run_id, codec, rank):
    folder = f"{store.layout.run_dir(run_id)}/weights-{rank}"
    files = {p.rsplit("/", 1)[-1]: store.read_bytes(p) for p in store.listdir(folder)}
    return codec.deserialize(files).state_dict()


def _assert_ranks_agree(model, store, run_id):
    """Both ranks ended with the same weights, and they are the ones fit returned."""
    codec = type(model).framework.codec
    w0, w1 = (_rank_weights(store, run_id, codec, r) for r in (0, 1))
    returned = model.model_.state_dict()
    assert w0.keys() == w1.keys() == returned.keys()
    for k in w0:
        torch.testing.assert_close(w0[k], w1[k], rtol=0, atol=0)
        torch.testing.assert_close(w0[k], returned[k], rtol=0, atol=0)


def _blobs(n=256, seed=0):
    """Two classes split by a plane: ``features`` (4,) float32 arrays and a 0/1 ``label``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    label = (x @ np.array([1.0, -1.0, 0.5, 0.25]) > 0).astype("float64")
    return pd.DataFrame({"id": np.arange(n), "features": list(x), "label": label})


def _estimator(store, run_id, **kw):
    from hora.dask import TorchEstimator

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return TorchEstimator(store=store, model=net, optimizer=torch.optim.Adam(net.parameters(), 0.02),
                          loss=torch.nn.BCEWithLogitsLoss(), feature_cols=["features"], label_cols=["label"],
                          batch_size=16, epochs=4, validation=0.2, random_seed=0, verbose=0, run_id=run_id,
                          callbacks=[RankWeights()], task="regression", **kw)  # (the logit as prediction)


def _accuracy(logits, labels):
    return float(np.mean((np.asarray(logits) > 0) == (np.asarray(labels) > 0.5)))


@pytest.mark.timeout(400)
def test_torch_fit_and_predict_on_pandas_and_ray_dataset(free_cluster, tmp_path):
    from hora.store import Store

    ray = free_cluster
    store = Store.create(str(tmp_path / "store"))
    pdf = _blobs()

    # a pandas frame, trained on 2 Ray actors
    model = _estimator(store, "ray-pandas", backend="ray", num_proc=2).fit(pdf)
    assert [h["epoch"] for h in model.history_] == [0, 1, 2, 3] and "val_loss" in model.history_[-1]
    _assert_ranks_agree(model, store, "ray-pandas")
    assert _accuracy(model.predict(pdf), pdf["label"]) > 0.9
    (pandas_dataset,) = store.listdir(store.layout.datasets_dir())
    assert pandas_dataset.rsplit("/", 1)[-1].startswith("pandas-")

    # a Ray Dataset (tensor column made by a pipeline), on Ray by default: 2 ranks from the cluster's CPUs
    ds = ray.data.from_pandas(pdf[["id", "label"]], override_num_blocks=3).map_batches(
        lambda b: {**b, "features": np.stack([pdf["features"][i] for i in b["id"]])}, batch_format="numpy")
    model = _estimator(store, "ray-dataset").fit(ds)
    _assert_ranks_agree(model, store, "ray-dataset")
    datasets = sorted(p.rsplit("/", 1)[-1] for p in store.listdir(store.layout.datasets_dir()))
    assert len(datasets) == 2 and any(d.startswith("ray-") for d in datasets)

    scored = model.transform(ds)
    assert type(scored).__name__ == "Dataset" and scored.columns() == ["id", "label", "features", "prediction"]
    rows = scored.to_pandas().sort_values("id")
    assert len(rows) == len(pdf) and _accuracy(rows["prediction"], rows["label"]) > 0.9
    with torch.no_grad():
        local = model.model_(torch.tensor(np.stack(pdf["features"]))).numpy().reshape(-1)
    np.testing.assert_allclose(rows["prediction"].to_numpy(), local, rtol=1e-5, atol=1e-6)
    predicted = model.predict(ds)
    assert predicted.columns() == ["prediction"] and predicted.count() == len(pdf)
    # the same model on the pandas frame gives the same predictions
    np.testing.assert_allclose(model.predict(pdf).to_numpy(), local, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(400)
def test_lightning_fit_on_a_ray_dataset_through_the_seam(free_cluster, tmp_path):
    pytest.importorskip("lightning")
    from hora.dask import LightningEstimator
    from hora.store import Store
    from tests.estimators import frames

    ray = free_cluster
    rows = frames.sparse_images(48)
    ds = ray.data.from_items([{"features": r[0].toArray().astype("float32"), "label": float(r[1])} for r in rows])
    store = Store.create(str(tmp_path / "store"))
    est = LightningEstimator(backend="ray", num_proc=2, store=store, model=frames.lightning_image_module(),
                             feature_cols=["features"], label_cols=["label"], batch_size=8, epochs=1,
                             validation=0.25, verbose=0, run_id="ray-lightning")
    model = est.fit(ds)
    assert [h["epoch"] for h in model.history_] == [0] and {"train_loss", "val_loss"} <= set(model.history_[0])
    out = model.transform(ds).to_pandas()
    probs = np.exp(np.stack(out["prediction"].to_numpy()))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    x = torch.tensor(np.stack(out["features"].to_numpy())).reshape(-1, 1, 8, 8)
    with torch.no_grad():
        np.testing.assert_allclose(np.log(probs), model.model_(x).numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(200)
def test_ray_datasets_materialize_once_with_their_values(free_cluster, tmp_path):
    import pyarrow.parquet as pq

    from hora.store import Store, materialize
    from hora.store.ray_source import check_tasks_reach, split_counts

    ray = free_cluster
    store = Store.create(str(tmp_path / "store"))
    n = 60
    img = np.arange(n * 4, dtype="float64").reshape(n, 2, 2)
    pdf = pd.DataFrame({"x": np.arange(n, dtype="float32"), "img": list(img), "y": np.arange(n) % 3})
    info = materialize(ray.data.from_pandas(pdf), store, feature_cols=["x", "img"], label_cols=["y"], num_proc=3)
    assert info.fingerprint.startswith("ray-") and not info.reused
    assert len(info.train_files) == 3  # one block, cut into num_proc parts by the write tasks
    assert info.columns["img"].shape == (2, 2) and info.columns["img"].dtype == "float64"
    table = pq.read_table(info.train_files).to_pandas().sort_values("x")
    np.testing.assert_array_equal(table["y"].to_numpy(), pdf["y"].to_numpy())
    np.testing.assert_array_equal(np.stack([np.stack(v) for v in table["img"]]), img)

    again = materialize(ray.data.from_pandas(pdf), store, feature_cols=["x", "img"], label_cols=["y"], num_proc=3)
    assert again.reused and again.fingerprint == info.fingerprint
    changed = pdf.copy()
    changed.loc[7, "x"] = -1.0
    other = materialize(ray.data.from_pandas(changed), store, feature_cols=["x", "img"], label_cols=["y"], num_proc=3)
    assert not other.reused and other.fingerprint != info.fingerprint

    memory = Store.create("memory://hora-ray-source")
    ranged = ray.data.range(100, override_num_blocks=4).map_batches(
        lambda b: {"x": b["id"].astype("float32"), "y": b["id"] % 2})
    mem = materialize(ranged, memory, feature_cols=["x"], label_cols=["y"], validation=0.25, num_proc=2)
    assert mem.train_rows + mem.val_rows == 100 and len(mem.train_files) == 4

    text = materialize(ray.data.from_items([{"s": "a", "y": 1.0}] * 4), store, feature_cols=["s"], label_cols=["y"])
    assert text.columns["s"].kind == "string"  # (a tokenizer= or collate_fn encodes it on the ranks)
    with pytest.raises(DataError, match=r"column 's' of the Ray Dataset has type struct<a: int64>"):
        materialize(ray.data.from_items([{"s": {"a": 1}, "y": 1.0}] * 4), store, feature_cols=["s"], label_cols=["y"])
    with pytest.raises(DataError, match=r"column\(s\) \['nope'\] not found in the Ray Dataset"):
        materialize(ranged, store, feature_cols=["nope"], label_cols=["y"])
    check_tasks_reach(ray, store)  # what multi-node clusters run before writing
    assert not [p for p in store.listdir(store.root) if "_hora_ray_check" in p]
    assert split_counts([10, 0, 30], 4) == [1, 1, 3] and split_counts([5, 5, 5], 2) == [1, 1, 1]


def _nothing_launched(ray, store):
    assert not store.exists(store.layout.runs_dir()) and not store.exists(store.layout.datasets_dir())
    assert not [pg for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED"]


@pytest.mark.timeout(120)
def test_bad_input_is_refused_on_the_driver(free_cluster, tmp_path, monkeypatch):
    from hora.runners import RayLauncher
    from hora.store import Store

    ray = free_cluster
    store = Store.create(str(tmp_path / "store"))
    pdf = _blobs(32)
    ds = ray.data.from_pandas(pdf[["id", "label"]])
    with pytest.raises(DataError, match=r"'features' \(feature_cols\) not in the Ray Dataset"):
        _estimator(store, "bad-cols").fit(ds)
    with pytest.raises(DataError, match=r"feature column\(s\) \['features'\] not in the Ray Dataset"):
        model = _estimator(store, "unused", backend="local")
        from hora.dask import TorchModel

        TorchModel(model=model.model, feature_cols=["features"], label_cols=["label"], output_shapes=[[1]]).transform(ds)
    with pytest.raises(DataError, match=r"'features' \(feature_cols\) not in the DataFrame"):
        _estimator(store, "bad-pandas-cols", backend="ray", num_proc=2).fit(pdf.drop(columns="features"))
    with pytest.raises(ConfigError, match="backend 'bogus' is unknown"):
        _estimator(store, "bad-name", backend="bogus").fit(pdf)
    with pytest.raises(ConfigError, match="use_gpu=True but the RayLauncher asks no GPU"):
        _estimator(store, "no-gpu", backend=RayLauncher(), use_gpu=True).fit(pdf)
    with monkeypatch.context() as patch:
        patch.setattr(ray, "is_initialized", lambda: False)
        with pytest.raises(ConfigError, match=r"backend='ray' needs a connected Ray cluster: call ray.init\(\)"):
            _estimator(store, "no-init", backend="ray").fit(pdf)
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
        with pytest.raises(ConfigError, match=r"backend='ray' needs Ray: pip install 'hora\[ray\]'"):
            _estimator(store, "no-ray", backend="ray", num_proc=2).fit(pdf)
    _nothing_launched(ray, store)


def _three_classes(n=120, seed=0):
    """``features`` (4,) float32 arrays and a class 0/1/2 ``y``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    return pd.DataFrame({"id": np.arange(n), "features": list(x), "y": (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5)})


@pytest.mark.timeout(300)
def test_classifier_transform_on_ray_equals_the_local_transform(free_cluster, tmp_path):
    from hora.dask import TorchModel
    from hora.estimators.tasks import ClassifierHead

    ray = free_cluster
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    model = TorchModel(model=net, feature_cols=["features"], label_cols=["y"], output_shapes=[[3]],
                       classifier=ClassifierHead(3, seen=(0, 1, 2)).to_meta(), probability_col="p")
    pdf = _three_classes()
    ds = ray.data.from_pandas(pdf, override_num_blocks=3)
    out = model.transform(ds)
    assert out.columns() == ["id", "features", "y", "rawPrediction", "p", "prediction"]
    rows = out.to_pandas().sort_values("id")
    probs = np.stack(rows["p"].to_numpy())
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    assert set(rows["prediction"].unique()) <= {0.0, 1.0, 2.0} and len(set(rows["prediction"])) > 1
    np.testing.assert_array_equal(rows["prediction"].to_numpy(), probs.argmax(axis=1))
    local = model.transform(pdf)
    np.testing.assert_array_equal(rows["prediction"].to_numpy(), local["prediction"].to_numpy())
    np.testing.assert_allclose(probs, np.stack(local["p"].to_numpy()), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.stack(rows["rawPrediction"].to_numpy()), np.stack(local["rawPrediction"].to_numpy()),
                               rtol=1e-5, atol=1e-6)
    assert model.predict(ds).columns() == ["prediction"]
    proba = model.predict_proba(ds)
    assert proba.columns() == ["p"] and proba.count() == len(pdf)
    # saved and loaded, it is still a classifier with its column names
    model.save(str(tmp_path / "model"))
    loaded = TorchModel.load(str(tmp_path / "model"))
    again = loaded.transform(ds).to_pandas().sort_values("id")
    assert loaded.task_ == "classification" and list(again.columns) == list(rows.columns)
    np.testing.assert_allclose(np.stack(again["p"].to_numpy()), probs, rtol=1e-6)


@pytest.mark.timeout(300)
def test_image_and_token_columns_transform_on_ray_with_the_fits_column_operations(free_cluster):
    from hora.dask import TorchModel
    from hora.estimators.tasks import ClassifierHead
    from tests.estimators import frames

    ray = free_cluster
    pdf = frames.column_frame(48, seed=3).assign(id=np.arange(48))
    pdf["word"] = [1 if w == "good" else 0 for w in pdf["word"]]  # as the Dask test gives its tokenizer's ids
    # as a fit with max_length=6 and a variable-length 'tok' keeps them (images: the default PNG decoder)
    columns = {"decode_fn": None, "max_length": 6, "truncation": True, "collate_fn": None, "ragged": ["tok"]}
    model = TorchModel(model=frames.multi_net(), feature_cols=["img", "tok", "tok_mask", "word"], label_cols=["y"],
                       output_shapes=[[2]], classifier=ClassifierHead(2, seen=(0.0, 1.0)).to_meta(),
                       inference_columns=columns)
    ds = ray.data.from_pandas(pdf, override_num_blocks=2)
    rows = model.transform(ds).to_pandas().sort_values("id")
    local = model.transform(pdf)  # pandas: the Dask transform's per-partition code
    assert len(rows) == len(pdf)
    np.testing.assert_allclose(np.stack(rows["probability"].to_numpy()), np.stack(local["probability"].to_numpy()),
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(rows["prediction"].to_numpy(), local["prediction"].to_numpy())
    # the fit's max_length applied on Ray: tokens past the 6th change nothing
    longer = pdf.assign(tok=[np.concatenate([t[:6], np.full(4, 11)]) if len(t) >= 6 else t for t in pdf["tok"]])
    cut = model.transform(ray.data.from_pandas(longer, override_num_blocks=2)).to_pandas().sort_values("id")
    np.testing.assert_allclose(np.stack(cut["probability"].to_numpy()), np.stack(rows["probability"].to_numpy()),
                               rtol=1e-6)
    # and its truncation=False: a longer row is an error naming the column and the length, from the Ray worker
    strict = TorchModel(model=model.model_, feature_cols=model.feature_cols_, label_cols=["y"], output_shapes=[[2]],
                        inference_columns={**columns, "truncation": False})
    with pytest.raises(Exception, match="column 'tok'.*10"):
        strict.transform(ray.data.from_pandas(longer, override_num_blocks=1)).materialize()


@pytest.mark.timeout(300)
def test_string_column_reaches_the_fits_collate_fn_on_ray(free_cluster):
    from hora.dask import TorchModel
    from hora.estimators.tasks import ClassifierHead
    from tests.estimators import frames

    ray = free_cluster
    pdf = frames.column_frame(40, seed=4)[["word", "y"]].assign(id=np.arange(40))
    torch.manual_seed(0)
    model = TorchModel(model=torch.nn.Embedding(2, 2), feature_cols=["word"], label_cols=["y"], output_shapes=[[2]],
                       classifier=ClassifierHead(2, seen=(0.0, 1.0)).to_meta(),
                       inference_columns={"decode_fn": None, "max_length": None, "truncation": True,
                                          "collate_fn": frames.column_words, "ragged": []})  # a tokenizer
    rows = model.transform(ray.data.from_pandas(pdf, override_num_blocks=2)).to_pandas().sort_values("id")
    local = model.transform(pdf)
    np.testing.assert_allclose(np.stack(rows["rawPrediction"].to_numpy()),
                               np.stack(local["rawPrediction"].to_numpy()), rtol=1e-6)
    with torch.no_grad():  # the words' ids (good: 1, bad: 0) looked up in the embedding
        expected = model.model_(torch.tensor([1 if w == "good" else 0 for w in pdf["word"]])).numpy()
    np.testing.assert_allclose(np.stack(rows["rawPrediction"].to_numpy()), expected, rtol=1e-6)
