"""The device feed (:class:`hora.estimators.worker.feed.DeviceFeed`): its thread, order, errors and early
stop on the CPU (``threaded=True``: the path a CUDA rank takes, with the copies left out), and a
Torch session's batches through it equal to the batches made in the step. The copies on a side
stream are checked on a GPU in tests/gpu/test_device_feed_cuda.py."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from hora.estimators.worker.feed import DeviceFeed, Fed

pytestmark = pytest.mark.timeout(60)


def _make(batch):
    return [torch.from_numpy(batch["x"]), None], {"rows": len(batch["x"])}


def _batches(n=5):
    return [{"x": np.full((3, 2), i, dtype=np.float32)} for i in range(n)]


@pytest.mark.parametrize("threaded", [False, True])
def test_batches_come_in_order_with_their_extra(threaded):
    feed = DeviceFeed("cpu", threaded=threaded)
    got = list(feed.batches(_batches(), _make))
    assert all(isinstance(b, Fed) for b in got)
    assert [float(b.tensors[0][0, 0]) for b in got] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert all(b.tensors[1] is None and b.extra == {"rows": 3} for b in got)


def test_the_cpu_path_has_no_thread():
    names = []

    def make(batch):
        names.append(threading.current_thread().name)
        return _make(batch)

    list(DeviceFeed("cpu").batches(_batches(2), make))
    list(DeviceFeed("cpu", threaded=True).batches(_batches(2), make))
    assert names[:2] == [threading.current_thread().name] * 2
    assert all(n.startswith("hora-device-feed-") for n in names[2:])


def test_an_error_in_the_feed_thread_is_raised_in_the_step():
    def make(batch):
        if batch["x"][0, 0] == 2:
            raise ValueError("bad batch 2")
        return _make(batch)

    got = []
    with pytest.raises(ValueError, match="bad batch 2"):
        for b in DeviceFeed("cpu", threaded=True).batches(_batches(), make):
            got.append(b)
    assert len(got) == 2


def test_stopping_early_stops_the_thread_and_closes_the_source():
    closed = threading.Event()

    def source():
        try:
            for b in _batches(100):
                yield b
        finally:
            closed.set()

    it = DeviceFeed("cpu", threaded=True, ahead=2).batches(source(), _make)
    next(it)
    it.close()
    assert closed.wait(5)
    assert not [t for t in threading.enumerate() if t.name.startswith("hora-device-feed-")]


def test_a_torch_session_reads_fed_batches_as_its_own():
    """The tensors a feed thread made (:meth:`TorchSession._host_tensors`) give the step what its own
    conversion of the numpy batch gives: inputs, aligned labels (class ids), weights, and the loss."""
    from hora.estimators.frameworks.torch.session import TorchSession

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    session = TorchSession(hvd=None, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                           losses=[torch.nn.CrossEntropyLoss(reduction="none")], metrics=[], feature_keys=("x",), label_cols=("y",),
                           sample_weight_col="w", loss_weights=[1.0])
    rng = np.random.default_rng(0)
    batches = [{"x": rng.normal(size=(6, 4)), "y": rng.integers(0, 3, 6).astype(np.float64),
                "w": np.ones(6, dtype=np.float32)} for _ in range(3)]
    fed = list(DeviceFeed("cpu", threaded=True).batches(batches, session._host_tensors))
    for batch, staged in zip(batches, fed):
        want_inputs, want_labels, want_w = session._tensors(batch)
        inputs, labels, weights = session._tensors(staged)
        assert inputs[0].dtype == torch.float32 and torch.equal(inputs[0], want_inputs[0])
        assert torch.equal(labels[0][0], want_labels[0][0]) and torch.equal(weights, want_w)
        assert session.eval_batch(staged) == session.eval_batch(batch)
