"""The transform's GPU path: its CPU-side logic here (error without a GPU, device selection used); on a GPU,
predictions computed on the device equal the CPU's."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from hora.errors import ConfigError
from hora.estimators.frameworks.torch.codec import TorchCodec
from hora.estimators.driver.transform import predict_frame

pytestmark = pytest.mark.timeout(120)


def _frame(n=37):
    rng = np.random.default_rng(0)
    return pd.DataFrame({"x": list(rng.normal(size=(n, 3)).astype(np.float32)), "k": np.arange(n)})


def _predict(model, use_gpu):
    return predict_frame(TorchCodec(), model, _frame(), ["x"], [[-1, 3]], ["p"], [[1]], batch_size=8, use_gpu=use_gpu)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_use_gpu_without_gpu_is_a_config_error():
    with pytest.raises(ConfigError, match=r"use_gpu=True for transform but host .* sees no CUDA device"):
        _predict(torch.nn.Linear(3, 1), True)


def test_use_gpu_routes_through_inference_device(monkeypatch):
    """The device chosen by inference_device is where the model and batches go (a fake 'GPU': the CPU)."""
    seen = []

    def fake_device():
        seen.append(1)
        return torch.device("cpu")

    monkeypatch.setattr("hora.estimators.devices.inference_device", fake_device)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    out = _predict(model, True)
    assert seen == [1]
    expected = model(torch.tensor(np.stack(_frame()["x"]))).detach().double().numpy().ravel()
    np.testing.assert_allclose(out["p"].to_numpy(), expected, rtol=1e-6)
    assert list(out["k"]) == list(range(37))


def test_use_gpu_refused_for_other_frameworks():
    class OtherCodec:
        def predict(self, *a, **k):
            raise AssertionError("must not run")

    with pytest.raises(ConfigError, match="supported for PyTorch models, not OtherCodec"):
        predict_frame(OtherCodec(), object(), _frame(), ["x"], [[-1, 3]], ["p"], [[1]], use_gpu=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_predictions_equal_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    cpu = _predict(model, False)["p"].to_numpy()
    gpu = _predict(model, True)
    assert next(model.parameters()).is_cuda
    np.testing.assert_allclose(gpu["p"].to_numpy(), cpu, rtol=1e-4, atol=1e-5)
