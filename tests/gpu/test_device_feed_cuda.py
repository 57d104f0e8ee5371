"""The device feed on a GPU: batches copied from pinned memory on a side stream, one batch ahead, the
step's stream waiting on an event (no host synchronize per batch); a Torch session's fed batches equal
its own conversion's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hora.estimators.worker.feed import DeviceFeed

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_batches_arrive_on_the_device_without_a_synchronize(monkeypatch):
    calls = []
    real = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: (calls.append(1), real(*a, **k)))
    pinned = []
    real_pin = torch.Tensor.pin_memory

    def pin(t, *a, **k):
        out = real_pin(t, *a, **k)
        pinned.append(out.is_pinned())
        return out

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    source = [np.full((256, 64), i, dtype=np.float32) for i in range(8)]
    feed = DeviceFeed("cuda")
    got = []
    for fed in feed.batches(source, lambda a: ([torch.from_numpy(a)], None)):
        t = fed.tensors[0]
        assert t.is_cuda
        got.append(float((t * 2).sum()))  # a kernel on the step's stream, after its wait on the copy
    assert not calls, "the feed synchronized the host"
    assert pinned and all(pinned)
    assert feed._stream is not None and feed._stream != torch.cuda.current_stream()
    assert got == [2.0 * i * 256 * 64 for i in range(8)]


def test_torch_session_batches_on_cuda_match_the_step_conversion():
    from hora.estimators.worker.feed import Fed
    from hora.estimators.frameworks.torch.session import TorchSession

    dev = torch.device("cuda", torch.cuda.current_device())
    model = torch.nn.Linear(4, 3).to(dev)
    session = TorchSession(hvd=None, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                           losses=[torch.nn.CrossEntropyLoss()], metrics=[], feature_keys=("x",), label_cols=("y",),
                           loss_weights=[1.0], device=dev)
    rng = np.random.default_rng(0)
    batches = [{"x": rng.normal(size=(6, 4)), "y": rng.integers(0, 3, 6)} for _ in range(3)]
    fed = list(session.batches(batches, None))
    assert all(isinstance(b, Fed) for b in fed)
    for batch, staged in zip(batches, fed):
        assert session.eval_batch(staged) == pytest.approx(session.eval_batch(batch))
