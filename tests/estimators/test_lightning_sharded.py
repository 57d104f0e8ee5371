"""LightningEstimator with Lightning's own sharded strategies on hora's ranks.

``ModelParallelStrategy`` (FSDP2's ``fully_shard`` in the module's ``configure_model``) runs on
CPU ranks over Gloo; ``FSDPStrategy`` (torch's FSDP1) needs a GPU, and says so on the driver.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hora.errors import ConfigError
from tests.estimators.frames import regression_frame

pl = pytest.importorskip("lightning.pytorch")
pytestmark = pytest.mark.timeout(420)


def _module(shard: bool):
    from torch.distributed.fsdp import fully_shard

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

        def configure_model(self):
            if shard:
                mesh = self.device_mesh["data_parallel"]
                for layer in self.net:
                    if isinstance(layer, torch.nn.Linear):
                        fully_shard(layer, mesh=mesh)
                fully_shard(self.net, mesh=mesh)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self(batch["features"]).squeeze(-1), batch["y"])
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

    return Regressor()


def _fit(store, *, strategy, epochs=3, run_id=None, num_proc=2):
    from hora.dask import LightningEstimator

    args = {} if strategy is None else {"strategy": strategy}
    est = LightningEstimator(num_proc=num_proc, store=store, model=_module(shard=strategy is not None),
                             feature_cols=["features"], label_cols=["y"], batch_size=32, epochs=epochs,
                             lr_scaling="none", random_seed=1, verbose=0, trainer_args=args, run_id=run_id)
    return est.fit(regression_frame())  # pandas: local ranks


def _weights(model) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in model.model_.state_dict().items()}


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted 3-epoch fits, hora's data-parallel strategy (None) and Lightning's
    ModelParallelStrategy, each made once for the tests that compare against them."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from hora.store import Store

    store = Store.create(str(tmp_path_factory.mktemp("sharded-whole")))
    return {None: _fit(store, strategy=None, epochs=3, run_id="whole-hora"),
            "model_parallel": _fit(store, strategy=ModelParallelStrategy(), epochs=3, run_id="whole-model-parallel")}


def test_model_parallel_strategy_trains_as_hora_does_and_returns_the_model_whole(whole):
    hora_model = whole[None]
    sharded = whole["model_parallel"]  # a ModelParallelStrategy() instance (the resume test passes its name)
    got, want = _weights(sharded), _weights(hora_model)
    assert set(got) == set(want)
    for name in want:  # plain tensors of the whole shapes (no DTensor shards), equal to the data-parallel run's
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)
    assert [h["epoch"] for h in sharded.history_] == [0, 1, 2]
    np.testing.assert_allclose([h["loss"] for h in sharded.history_], [h["loss"] for h in hora_model.history_],
                               rtol=1e-4)
    out = sharded.transform(regression_frame().head(8))  # the returned model transforms like any other
    assert len(out) == 8 and np.isfinite(np.stack(out["prediction"].to_numpy()).astype(float)).all()


def _model_entries(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if k != "data_wait"} for h in history]


@pytest.mark.parametrize("strategy", [None, "model_parallel"])
def test_a_fit_resumed_by_run_id_ends_with_the_uninterrupted_fits_weights(store, strategy, whole):
    """hora's data-parallel strategy and Lightning's ModelParallelStrategy: the checkpoint (weights, Adam's
    moments, loops) comes back whole, and the resumed epoch reads its own batches, not the previous epoch's."""
    whole = whole[strategy]
    first = _fit(store, strategy=strategy, epochs=2, run_id="resumed")
    resumed = _fit(store, strategy=strategy, epochs=3, run_id="resumed")
    assert [h["epoch"] for h in resumed.history_] == [0, 1, 2]
    assert resumed.history_[:2] == first.history_
    assert resumed.history_[2]["loss"] == pytest.approx(whole.history_[2]["loss"], rel=1e-5)
    got, want = _weights(resumed), _weights(whole)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    if strategy is not None:  # the 2-rank checkpoint resumed by one rank: Lightning reshards it as it loads
        _fit(store, strategy=strategy, epochs=2, run_id="alone")
        alone = _fit(store, strategy=strategy, epochs=3, run_id="alone", num_proc=1)
        # (two fits of the same data: the same losses; data_wait is each fit's own timing)
        assert [h["epoch"] for h in alone.history_] == [0, 1, 2] and _model_entries(alone.history_[:2]) == _model_entries(
            first.history_)
        # trained on from the 2-epoch weights (a fresh model's first epoch is ~3x this loss)
        assert alone.history_[2]["loss"] < first.history_[1]["loss"]


@pytest.mark.parametrize("strategy,match", [
    ("ddp", r"trainer_args\['strategy'\]='ddp': hora owns the strategy.*'model_parallel', 'fsdp'"),
    ("fsdp", r"FSDPStrategy but the ranks train on the CPU.*FSDP1.*use_gpu=True"),
])
def test_strategies_hora_cannot_run_here_are_refused_on_the_driver(store, strategy, match):
    with pytest.raises(ConfigError, match=match):
        _fit(store, strategy=strategy)


def test_model_parallel_without_configure_model_is_refused_on_the_driver(store):
    from hora.dask import LightningEstimator

    module = _module(shard=False)
    type(module).configure_model = pl.LightningModule.configure_model  # as if the module never defined it
    est = LightningEstimator(num_proc=2, store=store, model=module, feature_cols=["features"], label_cols=["y"],
                             epochs=1, trainer_args={"strategy": "model_parallel"})
    with pytest.raises(ConfigError, match=r"ModelParallelStrategy but the LightningModule Regressor does not define "
                                          r"configure_model\(\)"):
        est.fit(regression_frame())
