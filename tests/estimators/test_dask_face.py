"""hora.dask.TorchEstimator on a real Dask LocalCluster (2 worker processes, 2 ranks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.estimators.frames import mlp, regression_frame

pytestmark = [pytest.mark.dask, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def dask_fit(dask_client, tmp_path_factory):
    import dask
    import dask.dataframe as dd

    from hora.dask import TorchEstimator
    from hora.store import Store

    pdf = regression_frame(n=400)
    with dask.config.set({"dataframe.convert-string": False}):  # keep the array column as objects
        ddf = dd.from_pandas(pdf, npartitions=4)
    net = mlp()
    store = Store.create(str(tmp_path_factory.mktemp("dask-store")))
    est = TorchEstimator(
        num_proc=2, store=store, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
        loss=torch.nn.MSELoss(), metrics=[torch.nn.functional.l1_loss], feature_cols=["features"],
        label_cols=["y"], batch_size=32, epochs=3, validation=0.25, random_seed=1, verbose=0,
    )
    before = [p.detach().clone() for p in net.parameters()]
    model = est.fit(ddf)
    return est, model, pdf, ddf, before, net, store


def test_fit_trains_with_two_ranks(dask_fit):
    est, model, pdf, ddf, before, net, store = dask_fit
    assert len(model.history_) == 3
    first, last = model.history_[0], model.history_[-1]
    assert set(first) >= {"epoch", "loss", "val_loss", "val_l1_loss"}
    assert last["val_loss"] < first["val_loss"]
    # the user's module is untouched; the fitted one changed
    for p, b in zip(net.parameters(), before):
        assert torch.equal(p.detach(), b)
    assert any(not torch.equal(p.detach(), b) for p, b in zip(model.model_.parameters(), before))
    # rank 0 checkpointed every epoch and wrote TensorBoard files
    assert store.list_checkpoints(model.run_id_) == [0, 1, 2]
    assert store.listdir(store.layout.logs_dir(model.run_id_))


def test_transform_and_predict_on_dask(dask_fit):
    est, model, pdf, ddf, *_ = dask_fit
    out = model.transform(ddf).compute()
    assert list(out.columns) == ["features", "y", "prediction"]
    assert out["prediction"].dtype == np.float64
    expected = model.model_(torch.tensor(np.stack(pdf["features"]))).detach().numpy().ravel()
    np.testing.assert_allclose(out["prediction"].to_numpy(), expected, rtol=1e-5, atol=1e-5)
    pred = model.predict(ddf).compute()
    np.testing.assert_allclose(pred.to_numpy(), expected, rtol=1e-5, atol=1e-5)


def test_save_load_on_store_urls(dask_fit, tmp_path):
    from hora.dask import TorchModel

    est, model, pdf, *_ = dask_fit
    for url in (f"file://{tmp_path}/m", "memory://hora-tests/m"):
        model.save(url)
        loaded = TorchModel.load(url)
        assert loaded.history_ == model.history_ and loaded.run_id_ == model.run_id_
        a = loaded.transform(pdf.head(50))["prediction"].to_numpy()
        b = model.transform(pdf.head(50))["prediction"].to_numpy()
        np.testing.assert_array_equal(a, b)


def test_sklearn_conventions(dask_fit):
    est, model, *_ = dask_fit
    params = est.get_params()
    assert params["batch_size"] == 32 and params["epochs"] == 3
    clone = type(est)(**params)
    assert clone.get_params()["model"] is params["model"]
    assert est.set_params(epochs=5) is est and est.epochs == 5
    est.set_params(epochs=3)
    fitted = [k for k in vars(model) if k.endswith("_") and not k.startswith("_")]
    assert {"model_", "history_", "run_id_"} <= set(fitted)
