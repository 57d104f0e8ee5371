"""The data modern models eat: image bytes, variable-length token ids, strings and
sparse vectors, end to end through fit and transform on Spark local[2] and a Dask LocalCluster, the
sparse store's size against the non-zeros, and each bad input."""

from __future__ import annotations

import io
import logging

import numpy as np
import pandas as pd
import pytest
import torch

from hora.errors import ConfigError, DataError, HoraError
from tests.estimators import frames

pytestmark = [pytest.mark.timeout(600)]


_png, _frame, MultiNet, _words = frames.column_png, frames.column_frame, frames.multi_net, frames.column_words


def _args(store, **kw):
    net = MultiNet()
    args = dict(num_proc=2, store=store, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=0.05),
                loss=torch.nn.CrossEntropyLoss(), feature_cols=["img", "tok", "tok_mask", "word"], label_cols=["y"],
                batch_size=16, epochs=4, random_seed=1, verbose=0, transformation_fn=_words, max_length=6)
    args.update(kw)
    return args


def _accuracy(pred: np.ndarray, y: np.ndarray) -> float:
    """Logits per row (regression-style output) or class indices (a classifier's ``prediction``)."""
    pred = np.stack([np.asarray(p) for p in pred])
    return float(((pred.argmax(1) if pred.ndim == 2 else pred) == y).mean())


# --------------------------------------------------------------------------------------
# Dask LocalCluster
# --------------------------------------------------------------------------------------
@pytest.mark.dask
def test_dask_fit_and_transform_on_image_sequence_and_string_columns(dask_client, store, caplog):
    import dask
    import dask.dataframe as dd

    from hora.dask import TorchEstimator

    pdf = _frame()
    with dask.config.set({"dataframe.convert-string": False}):
        ddf = dd.from_pandas(pdf, npartitions=2)
    with caplog.at_level(logging.WARNING, logger="hora.store.columns"):
        model = TorchEstimator(**_args(store)).fit(ddf)
    assert model.history_[-1]["loss"] < 0.1  # the model learned from decoded images, padded ids and words
    assert len(model.history_) == 4
    assert any("truncated to max_length=6" in r.getMessage() for r in caplog.records)  # the driver's sample check
    # transform takes the same column types (decoded, padded to the longest row, masks made)
    test = _frame(40, seed=5)
    out = model.transform(test.assign(word=[1 if w == "good" else 0 for w in test["word"]]))
    assert _accuracy(out["prediction"].to_numpy(), test["y"].to_numpy()) >= 0.9


@pytest.mark.dask
def test_dask_decode_errors_raise_with_the_row_or_are_skipped(dask_client, store):
    import dask
    import dask.dataframe as dd

    from hora.dask import TorchEstimator

    pdf = _frame(96)
    bad = pdf.copy()
    bad.loc[bad.index[-1], "img"] = b"not a png"  # the last row: the driver's 16-row sample check passes it
    with dask.config.set({"dataframe.convert-string": False}):
        ddf = dd.from_pandas(bad, npartitions=2)
    with pytest.raises(HoraError, match=r"decode_fn of column 'img' failed on row \d+ of train/part-0000\d"):
        TorchEstimator(**_args(store, epochs=1)).fit(ddf)
    model = TorchEstimator(**_args(store, epochs=1, on_decode_error="skip", num_proc=1)).fit(bad)  # skipped, logged
    assert model.history_ and np.isfinite(model.history_[-1]["loss"])


# --------------------------------------------------------------------------------------
# Spark local[2]
# --------------------------------------------------------------------------------------
@pytest.mark.spark
def test_spark_fit_and_transform_on_image_sequence_and_string_columns(spark, store):
    from hora.spark import TorchEstimator

    pdf = _frame()
    sdf = spark.createDataFrame(pdf.assign(tok=[t.tolist() for t in pdf["tok"]]))
    model = TorchEstimator(**_args(store)).fit(sdf)
    assert model.getHistory()[-1]["loss"] < 0.1
    test = _frame(40, seed=5)
    tdf = spark.createDataFrame(test.assign(tok=[t.tolist() for t in test["tok"]],
                                            word=[1 if w == "good" else 0 for w in test["word"]]))
    rows = model.transform(tdf).select("prediction", "y").toPandas()
    assert _accuracy(rows["prediction"].to_numpy(), rows["y"].to_numpy()) >= 0.9


class SparseLogit(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(dim, 1)
        self.seen = []

    def forward(self, x):
        return self.lin(x)


def _sparse_frame(spark, n=400, dim=1 << 12, nnz=8, seed=0):
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        idx = np.sort(rng.choice(dim, nnz, replace=False))
        y = float(idx[0] < dim // 8)  # the label hangs on a few features
        rows.append((Vectors.sparse(dim, idx.tolist(), [1.0] * nnz), y))
    return spark.createDataFrame(rows, ["features", "y"])


@pytest.mark.spark
@pytest.mark.parametrize("sparse_format", ["csr", "dense"])
def test_spark_sparse_vectors_stored_sparse_and_batched(spark, store, sparse_format):
    from hora.spark import TorchEstimator

    dim, n, nnz = 1 << 12, 400, 8
    sdf = _sparse_frame(spark, n, dim, nnz)
    net = SparseLogit(dim)
    model = TorchEstimator(num_proc=2, store=store, model=net, optimizer=torch.optim.Adam(net.parameters(), 0.05),
                           loss=torch.nn.BCEWithLogitsLoss(), feature_cols=["features"], label_cols=["y"],
                           batch_size=32, epochs=3, verbose=0, compress_sparse_cols=True,
                           sparse_format=sparse_format).fit(sdf)
    assert model.getHistory()[-1]["loss"] < model.getHistory()[0]["loss"]
    # the store's size follows the non-zeros: int32 index + float32 value each (and a little per row)
    (fp,) = store.listdir(store.layout.datasets_dir())
    from hora.store import load_dataset_info

    info = load_dataset_info(store, fp.rstrip("/").rsplit("/", 1)[-1])
    assert info.columns["features"].kind == "sparse" and info.columns["features"].size == dim
    stored = sum(store.size(p) for split in ("train", "val") for p in info.file_paths(split))
    assert stored <= 1.5 * n * nnz * 8 + 4096 * len(info.train_files), stored
    assert stored < n * dim * 4 / 20  # far below the dense float32 store
    scored = model.transform(sdf.limit(50)).select("prediction").toPandas()
    assert len(scored) == 50 and np.isfinite(scored["prediction"].to_numpy()).all()


@pytest.mark.spark
def test_spark_bad_inputs(spark, store):
    from hora.spark import TorchEstimator

    pdf = _frame(64)
    sdf = spark.createDataFrame(pdf.assign(tok=[t.tolist() for t in pdf["tok"]]))
    # a sequence longer than max_length with truncation=False: the column and the length
    with pytest.raises(HoraError, match=r"column 'tok' has a row of length \d+ .*max_length=3, and truncation=False"):
        TorchEstimator(**_args(store, max_length=3, truncation=False, epochs=1)).fit(sdf)

    def broken_collate(batch):
        raise ValueError("tokenizer exploded")

    with pytest.raises(HoraError, match=r"collate_fn failed on a batch of columns .*'tok'.*tokenizer exploded"):
        TorchEstimator(**_args(store, collate_fn=broken_collate, epochs=1)).fit(sdf)
    # strings that reach the model: named, before anything starts
    with pytest.raises(DataError, match=r"\['word'\] hold bytes or strings"):
        TorchEstimator(**_args(store, transformation_fn=None, epochs=1)).fit(sdf)
    with pytest.raises(ConfigError, match="decode_fn names column 'nope'"):
        TorchEstimator(**_args(store, decode_fn={"nope": len})).fit(sdf)
    with pytest.raises(ConfigError, match="on_decode_error"):
        TorchEstimator(**_args(store, on_decode_error="ignore")).fit(sdf)


def test_decode_error_names_the_column_and_row_on_the_rank(store):
    """A decode_fn that raises on the rank: the error names the column and where the row is stored."""
    from hora.store import ColumnOps, make_reader, materialize
    from hora.store.reader import row_position

    pdf = _frame(40)
    pdf.loc[7, "img"] = b"broken"
    info = materialize(pdf, store, ["img"], ["y"], num_proc=2)
    reader = make_reader(store, info, batch_size=8, shuffle=False, row_ids=True)
    reader.batch_fn = ColumnOps(specs=dict(info.columns), decode={"img": __import__("hora").store.decode_image},
                                where=lambda i: row_position(reader, i))
    with pytest.raises(DataError, match=r"decode_fn of column 'img' failed on row 7 of train/part-00000"):
        list(reader)
    reader.batch_fn.on_decode_error = "skip"
    rows = sum(len(b["y"]) for b in reader)
    assert rows == 39 and reader.batch_fn.skipped == 1


def test_inmemory_cache_keeps_the_stored_rows_and_pads_each_replayed_batch(store):
    """inmemory_cache_all: the cache holds the rows as read (ragged), each pass pads its own batches."""
    from hora.estimators.worker.batches import CachedReader
    from hora.store import ColumnOps, make_reader, materialize

    pdf = _frame(64)
    info = materialize(pdf, store, ["tok"], ["y"])
    reader = make_reader(store, info, batch_size=16, shuffle=True)
    reader.batch_fn = ColumnOps(specs=dict(info.columns))
    cached = CachedReader(reader)
    first = list(cached)
    cached.set_epoch(1)
    second = list(cached)
    assert len(first) == len(second) == 4
    for batch in first + second:
        longest = int(batch["tok_mask"].sum(1).max())
        assert batch["tok"].shape == (16, longest)  # padded to this batch's own longest row
    assert sorted(np.concatenate([b["y"] for b in second]).tolist()) == sorted(pdf["y"].tolist())


class _CountingDecoder:
    """decode_image, counting its calls and the threads it ran on."""

    def __init__(self):
        import threading

        self.calls, self.threads, self._lock = 0, set(), threading.Lock()

    def __call__(self, data):
        import threading

        from hora.store import decode_image

        with self._lock:
            self.calls += 1
            self.threads.add(threading.current_thread().name)
        return decode_image(data)


def test_inmemory_cache_decodes_each_image_once_in_the_prefetch_thread(store):
    """inmemory_cache_all with an image column: the first pass decodes (in the reader's prefetch thread,
    a skipped row dropped), later passes replay the decoded rows, equal to decoding them again."""
    from hora.estimators.worker.batches import CachedReader
    from hora.store import ColumnOps, decode_image, make_reader, materialize

    pdf = _frame(64)
    pdf.loc[5, "img"] = b"broken"
    info = materialize(pdf, store, ["img"], ["y"])
    decoder = _CountingDecoder()
    reader = make_reader(store, info, batch_size=16, shuffle=True, row_ids=True)
    reader.batch_fn = ColumnOps(specs=dict(info.columns), decode={"img": decoder}, on_decode_error="skip")
    cached = CachedReader(reader)
    first = list(cached)
    assert decoder.calls == 64 and all(t.startswith("hora-reader-batches") for t in decoder.threads)
    for epoch in (1, 2):
        cached.set_epoch(epoch)
        again = list(cached)
        assert len(again) == len(first) == 4 and decoder.calls == 64  # nothing decoded again
        assert sum(len(b["y"]) for b in again) == 63  # the broken image stays skipped
        assert all(b["img"].shape[1:] == first[0]["img"].shape[1:] and b["img"].dtype == np.uint8 for b in again)
        assert "__hora_row__" not in again[0]
    # the kept rows are the decoded images: each replayed row is its stored image decoded
    decoded = {int(y): [] for y in pdf["y"]}
    for data, y in zip(pdf["img"], pdf["y"]):
        if data != b"broken":
            decoded[int(y)].append(decode_image(data))
    for b in again:
        for img, y in zip(b["img"], b["y"]):
            assert any(np.array_equal(img, d) for d in decoded[int(y)])


# --------------------------------------------------------------------------------------
# transform applies the fit's decode_fn, max_length / truncation and collate_fn
# --------------------------------------------------------------------------------------
def _brightness(data: bytes) -> np.ndarray:
    """A decode_fn: an image's mean, min and max brightness (3 values, not the default HWC pixels)."""
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(data)), dtype=np.float32) / 255.0
    return np.array([pixels.mean(), pixels.min(), pixels.max()], dtype=np.float32)


def _fixed_tokens(batch):
    """A collate_fn: token ids cut or zero-padded to exactly 10 per row (the default pads to the longest)."""
    out = dict(batch)
    out["tok"] = np.stack([np.pad(t[:10], (0, 10 - len(t[:10]))) for t in batch["tok"]]).astype(np.int64)
    return out


class FixedNet(torch.nn.Module):
    """Takes exactly 3 image values and 10 token ids a row: any other shape fails."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(12, 2)
        self.lin = torch.nn.Linear(3 + 10 * 2, 2)

    def forward(self, img, tok):
        return self.lin(torch.cat([img.float(), self.emb(tok).flatten(1)], 1))


class TokenBag(torch.nn.Module):
    """Padded token ids and their mask: two logits."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(12, 2)

    def forward(self, tok, mask):
        return (self.emb(tok) * mask.unsqueeze(-1).to(self.emb.weight.dtype)).sum(1)


def _fixed_args(store, **kw):
    net = FixedNet()
    args = dict(num_proc=2, store=store, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=0.05),
                loss=torch.nn.CrossEntropyLoss(), feature_cols=["img", "tok"], label_cols=["y"], batch_size=16,
                epochs=3, random_seed=1, verbose=0, decode_fn={"img": _brightness}, collate_fn=_fixed_tokens)
    args.update(kw)
    return args


def test_transform_applies_the_fits_decode_fn_and_collate_fn_also_after_save_and_load(store, tmp_path):
    from hora.dask import TorchEstimator, TorchModel

    pdf = _frame(96)
    model = TorchEstimator(**_fixed_args(store)).fit(pdf)
    test = _frame(40, seed=5)
    expected = _accuracy(model.transform(test)["prediction"].to_numpy(), test["y"].to_numpy())
    assert expected >= 0.9  # brightness tells the class
    model.save(str(tmp_path / "model"))
    loaded = TorchModel.load(str(tmp_path / "model"))
    assert loaded.inference_columns_["collate_fn"] is not None
    np.testing.assert_array_equal(loaded.predict(test).to_numpy(), model.predict(test).to_numpy())
    # the fit's max_length and truncation, and its variable-length column: rows over max_length are
    # refused without truncation even when every row of the frame to transform has one length
    net = TokenBag()
    plain = TorchEstimator(**_args(store, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), epochs=1,
                                   num_proc=1, max_length=6, truncation=False, transformation_fn=None,
                                   feature_cols=["tok", "tok_mask"])).fit(
        _frame(32).assign(tok=lambda f: [t[:6] for t in f["tok"]]))
    assert plain.inference_columns_ == {"decode_fn": None, "max_length": 6, "truncation": False, "collate_fn": None,
                                        "ragged": ["tok"]}
    same_length = plain.transform(test.assign(tok=[np.arange(1, 5)] * len(test)))["prediction"]
    assert same_length.notna().all() and len(same_length) == len(test)
    with pytest.raises(DataError, match="column 'tok'.*8"):
        plain.transform(test.assign(tok=[np.arange(1, 9)] * len(test)))


@pytest.mark.spark
def test_spark_transform_applies_the_fits_decode_fn_and_collate_fn_also_after_save_and_load(spark, store, tmp_path):
    from hora.spark import TorchEstimator, TorchModel

    pdf = _frame(96)
    sdf = spark.createDataFrame(pdf.drop(columns="word").assign(tok=[t.tolist() for t in pdf["tok"]]))
    model = TorchEstimator(**_fixed_args(store)).fit(sdf)
    test = _frame(40, seed=5).drop(columns="word")
    tdf = spark.createDataFrame(test.assign(tok=[t.tolist() for t in test["tok"]]))
    rows = model.transform(tdf).select("prediction", "y").toPandas()
    assert _accuracy(rows["prediction"].to_numpy(), rows["y"].to_numpy()) >= 0.9
    path = str(tmp_path / "spark-model")
    model.write().overwrite().save(path)
    again = TorchModel.load(path).transform(tdf).select("prediction").toPandas()
    np.testing.assert_array_equal(again["prediction"].to_numpy(), rows["prediction"].to_numpy())
