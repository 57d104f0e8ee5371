"""Engine-free parts: pandas prediction with several outputs, persistence, history plots, config."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from hora.errors import ConfigError, DataError, StoreError

pytestmark = pytest.mark.timeout(60)


class TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 8)
        self.a = torch.nn.Linear(8, 1)
        self.b = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return self.a(h), self.b(h)


def _model(**kw):
    from hora.dask import TorchModel

    torch.manual_seed(0)
    args = dict(model=TwoHeads(), feature_cols=["x"], label_cols=["p", "q"], output_shapes=[(1,), (3,)])
    args.update(kw)
    return TorchModel(**args)


def test_predict_several_outputs_default_names_and_types():
    df = pd.DataFrame({"x": list(np.random.default_rng(0).normal(size=(7, 4)).astype("float32"))})
    model = _model(batch_size=3)  # several forward passes
    out = model.transform(df)
    assert list(out.columns) == ["x", "p__output", "q__output"]
    assert out["p__output"].dtype == np.float64 and len(out["q__output"].iloc[0]) == 3
    a, b = model.model_(torch.tensor(np.stack(df["x"])))
    np.testing.assert_allclose(out["p__output"], a.detach().numpy().ravel(), rtol=1e-6)
    np.testing.assert_allclose(np.stack(out["q__output"]), b.detach().numpy(), rtol=1e-6)
    named = _model(output_cols=["score", "probs"]).predict(df)
    assert list(named.columns) == ["score", "probs"]
    with pytest.raises(DataError, match=r"feature column\(s\) \['x'\] not in"):
        model.transform(df.rename(columns={"x": "z"}))


def test_save_load_round_trip_and_missing(tmp_path):
    from hora.dask import TorchModel

    model = _model(history=[{"epoch": 0, "loss": 1.0}], run_id="r1")
    model.save(str(tmp_path / "m"))
    loaded = TorchModel.load(str(tmp_path / "m"))
    assert loaded.history_ == model.history_ and loaded.output_cols_ == model.output_cols_
    for p, q in zip(loaded.model_.parameters(), model.model_.parameters()):
        assert torch.equal(p, q)
    with pytest.raises(StoreError, match="holds no saved hora model"):
        TorchModel.load(str(tmp_path / "nothing"))
    with pytest.raises(StoreError, match="already holds a saved model"):
        model.save(str(tmp_path / "m"), overwrite=False)



def _as_before_the_subpackages(data: bytes, moves: dict[str, str]) -> bytes:
    """A protocol-2 pickle with each of ``moves``' new module paths (``old: new``) written as the old one."""
    def unicode(path: str) -> bytes:  # a cloudpickled module's path: BINUNICODE
        return b"X" + len(path).to_bytes(4, "little") + path.encode()

    for old, new in moves.items():
        renamed = data.replace(f"c{new}\n".encode(), f"c{old}\n".encode()).replace(unicode(new), unicode(old))
        assert renamed != data, new
        data = renamed
    return data


def test_a_model_saved_under_the_estimators_old_module_paths_loads(tmp_path):
    import importlib
    import importlib.util
    import pickle

    import cloudpickle

    from hora.dask import TorchModel
    from hora.estimators import old_names
    from hora.estimators.data import frames
    from hora.estimators.faces import spark
    from hora.store import Store

    # every old path names a module that exists; none is left at its old path (or it is a package now)
    for old, new in old_names.OLD_MODULES.items():
        importlib.import_module(new)
        found = importlib.util.find_spec(old)
        assert found is None or found.submodule_search_locations is not None, old
    mixin = spark.HasBatchSize  # a Spark Param's mixin of older versions pickles under the face's module
    settings = {"decode_fn": frames.group_key, "mixin": mixin, "module": frames}
    data = _as_before_the_subpackages(cloudpickle.dumps({"inference_columns": settings}, protocol=2),
                                      {"hora.estimators.data": "hora.estimators.data.frames",
                                       "hora.estimators.spark_face": "hora.estimators.faces.spark"})
    with pytest.raises(AttributeError):  # hora.estimators.data is a package now: plain pickle finds no group_key
        pickle.loads(data)
    model = _model()
    model.save(str(tmp_path / "m"))
    Store.create(str(tmp_path / "m"), check_writable=False).write_bytes("objects.pkl", data)
    loaded = TorchModel.load(str(tmp_path / "m"))
    assert loaded.inference_columns_ == settings

def test_plot_history():
    model = _model(history=[{"epoch": 0, "loss": 2.0, "val_loss": 2.5, "val_acc": 0.5, "data_wait": 0.3},
                            {"epoch": 1, "loss": 1.0, "val_loss": 1.5, "val_acc": 0.7, "data_wait": 0.1}])
    fig = model.plot_history()  # the model's loss and metrics; the feed's data_wait only when named
    assert [ax.get_title() for ax in fig.axes] == ["loss", "acc"]
    assert [len(line.get_xdata()) for line in fig.axes[0].lines] == [2, 2]
    assert [ax.get_title() for ax in model.plot_history(["loss", "data_wait"]).axes] == ["loss", "data_wait"]
    with pytest.raises(ConfigError, match="not in the history"):
        model.plot_history(["f1"])
    with pytest.raises(ConfigError, match="no training history"):
        _model().plot_history()


def test_config_rejects_unknown_and_checks_types(tmp_path):
    from hora.estimators.params import EstimatorConfig

    with pytest.raises(ConfigError, match="unknown estimator parameter.*did you mean .batch_size."):
        EstimatorConfig.from_params({"batchsize": 3})
    base = dict(store=str(tmp_path), model=object(), optimizer=object(), loss=torch.nn.MSELoss(),
                feature_cols=["x"], label_cols=["y"])
    cfg = EstimatorConfig(**base, validation=0.0)
    assert cfg.validation is None and cfg.store.url.startswith("file://")
    with pytest.raises(ConfigError, match="both in feature_cols and label_cols"):
        EstimatorConfig(**{**base, "label_cols": ["x"]})
    with pytest.raises(ConfigError, match="batch_size"):
        EstimatorConfig(**base, batch_size=True)



def test_feature_cols_are_parsed_once_into_features_which_copies_pickles_and_replace_keep_right(tmp_path):
    import dataclasses
    import pickle

    from hora.estimators.data.frames import Features
    from hora.estimators.params import EstimatorConfig
    from hora.estimators.spec import TrainSpec

    cfg = EstimatorConfig(store=str(tmp_path), model=object(), optimizer=object(), loss=torch.nn.MSELoss(),
                          feature_cols=["a", ("b", "c")], label_cols=["y"])
    assert cfg.features == Features(("a", ("b", "c"))) and cfg.feature_cols == ["a", ["b", "c"]]
    assert cfg.features is cfg.features  # a field, not parsed at each reading
    worker = cfg.for_workers(task="regression")
    assert worker.features is cfg.features and pickle.loads(pickle.dumps(worker)).features == cfg.features
    assert dataclasses.replace(cfg, feature_cols=["z"]).features == Features(("z",))  # parsed again
    assert cfg == dataclasses.replace(cfg)  # not a parameter: equality and repr are the parameters'
    assert "features=" not in repr(cfg)
    spec = TrainSpec(framework=None, config=worker, payload=b"", common=b"", store=cfg.store, dataset=None,
                     run_id="r", num_proc=1)
    assert spec.features is worker.features and spec.has_val is False
    assert pickle.loads(pickle.dumps(spec)).features == cfg.features

@pytest.mark.timeout(60)
def test_the_resume_check_reads_each_frameworks_own_checkpoint_format():
    import io
    import types

    from hora.estimators.frameworks.lightning import LightningCodec
    from hora.estimators.frameworks.torch.codec import TorchCodec

    def saved(obj) -> bytes:
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()

    model, other = torch.nn.Linear(4, 2), torch.nn.Linear(3, 2)
    config = types.SimpleNamespace(model=model)
    # Torch runs checkpoint {"model": state_dict, ...}; Lightning runs are Lightning's own ({"state_dict": ...})
    for codec, key in ((TorchCodec(), "model"), (LightningCodec(), "state_dict")):
        codec.check_checkpoint(config, saved({key: model.state_dict(), "epoch": 1}), "the checkpoint")
        with pytest.raises(ConfigError, match=r"the checkpoint belongs to another model: 'weight' has shape"):
            codec.check_checkpoint(config, saved({key: other.state_dict()}), "the checkpoint")
        wrong = "state_dict" if key == "model" else "model"
        with pytest.raises(ConfigError, match=rf"holds no model state \(no '{key}' entry\)"):
            codec.check_checkpoint(config, saved({wrong: model.state_dict()}), "the checkpoint")


@pytest.mark.timeout(120)
def test_tensorboard_writer_is_made_in_the_background_and_its_errors_reach_log(tmp_path, monkeypatch):
    """Rank 0's TensorBoard writer is built off the training thread; the first log waits for it
    and writes event files; a failure to build it is raised by that log, not lost."""
    import types as _types

    from hora.estimators.worker import loop as worker
    from hora.store import Store

    store = Store.create(str(tmp_path / "store"))
    spec = _types.SimpleNamespace(store=store, run_id="tb-run")
    tb = worker._TensorBoard(spec)
    tb.log(0, {"loss": 1.5})
    tb.close()
    assert any("tfevents" in p for p in store.listdir(store.layout.logs_dir("tb-run")))

    def broken(self):
        raise OSError("logs dir is read-only")

    monkeypatch.setattr(worker._TensorBoard, "_open", broken)
    tb = worker._TensorBoard(spec)
    with pytest.raises(OSError, match="read-only"):
        tb.log(0, {"loss": 1.0})
    tb.close()


@pytest.mark.parametrize("weights", [[1.0, 1.0], [1.0, 0.25], [0.0, 2.0]])
def test_the_training_loss_is_the_weighted_sum_of_the_label_losses(weights):
    from types import SimpleNamespace

    from hora.estimators.frameworks.torch.codec import TorchSession

    torch.manual_seed(0)
    outs = [torch.randn(5, 1, requires_grad=True), torch.randn(5, 3, requires_grad=True)]
    labels = [torch.randn(5, 1), torch.randn(5, 3)]
    fns = [torch.nn.MSELoss(), torch.nn.L1Loss()]
    session = SimpleNamespace(losses=fns, loss_weights=weights, class_weights=None)
    total = TorchSession._loss(session, outs, labels, None)
    want = weights[0] * fns[0](outs[0], labels[0]) + weights[1] * fns[1](outs[1], labels[1])
    assert torch.allclose(total, want)
    total.backward()  # the weights reach the gradients too
    g0 = outs[0].grad.clone()
    outs[0].grad = None
    fns[0](outs[0], labels[0]).backward()
    assert torch.allclose(g0, weights[0] * outs[0].grad)
