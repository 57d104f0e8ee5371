"""The Torch session's step, with what it decides once and keeps between steps.

The parameter dtype (:class:`ParamDtype`), each label's alignment rule
(:class:`LabelConverter`) and the loss value (:func:`loss_value`) are kept or taken a
cheaper way than before; each must give what the plain per-batch path gives
(:func:`_param_dtype`, ``align_label(out, _tensor(_stack(values)))``, ``float(loss.detach())``),
batch after batch, through changes of batch size, label dtype and shape, and model dtype,
with the same errors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hora.errors import ConfigError, DataError
from hora.estimators.frameworks.torch.codec import TorchSession
from hora.estimators.frameworks.torch.tensors import (
    LabelConverter, ParamDtype, _param_dtype, _stack, _tensor, align_label, loss_value, to_inputs,
)

pytestmark = pytest.mark.timeout(60)


def reference_align_label(output, label, name="label"):
    """align_label as it was written before its decision was split from its application (5 Dec 2026)."""
    if output.is_floating_point() and output.dim() == label.dim() + 1 and output.shape[-1] > 1 and \
            tuple(output.shape[:-1]) == tuple(label.shape):
        if label.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
            return label.long()
        if label.is_floating_point() and bool(torch.all(label == torch.round(label))):
            return label.long()
    label = label.to(output.dtype) if output.is_floating_point() else label
    if tuple(label.shape) != tuple(output.shape):
        n = output.shape[0] if output.dim() else 1
        if output.dim() >= 1 and label.dim() >= 1 and label.shape[0] == n and label.numel() == output.numel():
            return label.reshape(output.shape)
        raise ConfigError(
            f"label {name!r} has per-row shape {tuple(label.shape[1:])} but the model's output for it has "
            f"per-row shape {tuple(output.shape[1:])}"
        )
    return label


def _outcome(fn, *args):
    """``("ok", dtype, shape, values)`` or ``("error", type, message)`` of ``fn(*args)``."""
    try:
        t = fn(*args)
    except Exception as exc:  # the error is the outcome compared
        return ("error", type(exc), str(exc))
    return ("ok", t.dtype, tuple(t.shape), t.detach().double().numpy().tolist())


OUTPUTS = [((6, 1), torch.float32), ((6, 3), torch.float32), ((6,), torch.float64), ((6, 2, 2), torch.float32),
           ((6, 1), torch.int64), ((6, 3), torch.bfloat16), ((0, 3), torch.float32)]
LABELS = [((6,), np.float32, "whole"), ((6,), np.float32, "frac"), ((6,), np.float64, "whole"),
          ((6,), np.int64, "whole"), ((6,), np.int32, "whole"), ((6,), np.bool_, "whole"), ((6,), np.uint8, "whole"),
          ((6, 1), np.float32, "frac"), ((6, 3), np.float64, "frac"), ((6, 4), np.float32, "frac"),
          ((5,), np.float32, "frac"), ((0,), np.float32, "frac")]


def _label_values(shape, dtype, kind, seed=0):
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 3, size=shape) + (0.25 if kind == "frac" and np.dtype(dtype).kind == "f" else 0)
    return values.astype(dtype)


@pytest.mark.parametrize("out_shape,out_dtype", OUTPUTS)
def test_align_label_and_the_converter_give_what_align_label_gave(out_shape, out_dtype):
    """Every output x label pair of shapes, dtypes and values: the same tensor or the same error,
    from align_label and from a converter on its first, second and third batch."""
    output = torch.zeros(out_shape, dtype=out_dtype)
    for shape, dtype, kind in LABELS:  # (labels of 5 and 0 rows: against outputs of 6 and 0 rows)
        conv = LabelConverter("y")
        for seed in range(3):  # the first batch decides; the next ones reuse the kept rule
            values = _label_values(shape, dtype, kind, seed)
            want = _outcome(reference_align_label, output, _tensor(_stack(values)), "y")
            assert _outcome(align_label, output, _tensor(_stack(values)), "y") == want, (shape, dtype, kind)
            assert _outcome(lambda: conv.align(output, conv.tensor(values))) == want, (shape, dtype, kind, seed)


def test_the_converter_keeps_a_rule_per_batch_shape_and_dtype_and_refits_when_the_output_changes():
    conv = LabelConverter("price")
    out1, out3 = torch.zeros(8, 1), torch.zeros(8, 3)
    y = np.arange(8, dtype=np.float32)
    first = conv.tensor(y)
    assert first[2] is None  # nothing kept before the first batch
    label = conv.align(out1, first)
    assert label.shape == (8, 1) and label.dtype == torch.float32
    again = conv.tensor(y + 1)
    assert again[2] is not None and tuple(again[0].shape) == (8, 1)  # aligned before the forward pass
    assert torch.equal(conv.align(out1, again), torch.from_numpy(y + 1).reshape(8, 1))
    # the smaller last batch: its own rule, the first one kept too
    small = np.arange(3, dtype=np.float32)
    assert conv.tensor(small)[2] is None
    assert tuple(conv.align(torch.zeros(3, 1), conv.tensor(small)).shape) == (3, 1)
    assert conv.tensor(small)[2] is not None and conv.tensor(y)[2] is not None
    # a label of another dtype, then of another shape
    y64 = y.astype(np.float64)
    assert conv.tensor(y64)[2] is None
    assert conv.align(out1, conv.tensor(y64)).dtype == torch.float32
    assert conv.align(out1, conv.tensor(y64)).dtype == torch.float32
    col = y.reshape(8, 1)
    assert torch.equal(conv.align(out1, conv.tensor(col)), torch.from_numpy(col))
    # the output changes under a kept rule: (8,) float labels against 3 classes are class ids now
    kept = conv.tensor(y % 3)
    assert kept[2] is not None
    ids = conv.align(out3, kept)
    assert ids.dtype == torch.int64 and torch.equal(ids, torch.from_numpy(y % 3).long())
    # float labels against classes are checked per batch: a batch of fractions is an error, each time
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"label 'price' has per-row shape \(\) but the model's output for it "
                                              r"has per-row shape \(3,\)"):
            conv.align(out3, conv.tensor(y + 0.5))
    assert torch.equal(conv.align(out3, conv.tensor(y % 3)), torch.from_numpy(y % 3).long())
    # an output dtype change (model.double()) under a kept rule
    assert conv.align(torch.zeros(8, 1, dtype=torch.float64), conv.tensor(y)).dtype == torch.float64


def test_the_converter_shares_memory_copies_read_only_arrays_moves_to_its_device_and_forgets_rules_at_its_cap():
    conv = LabelConverter("y", device=torch.device("cpu"))
    out = torch.zeros(4, 1)
    y = np.arange(4, dtype=np.float32)
    conv.align(out, conv.tensor(y))
    label = conv.align(out, conv.tensor(y))
    y[0] = 42.0  # the tensor is a view of the batch's array, as _tensor made it
    assert label[0, 0].item() == 42.0
    frozen = np.arange(4, dtype=np.float32)
    frozen.setflags(write=False)
    copied = conv.align(out, conv.tensor(frozen))
    assert torch.equal(copied, torch.arange(4, dtype=torch.float32).reshape(4, 1))
    for n in range(1, LabelConverter.MAX_RULES + 3):  # more batch sizes than it keeps rules for
        values = np.arange(n, dtype=np.float32)
        assert torch.equal(conv.align(torch.zeros(n, 1), conv.tensor(values)), torch.from_numpy(values).reshape(n, 1))
    assert 0 < len(conv._rules) <= LabelConverter.MAX_RULES


def test_a_label_error_raises_the_same_message_on_every_batch():
    conv = LabelConverter("target")
    out = torch.zeros(4, 2)
    for _ in range(3):
        with pytest.raises(ConfigError, match=r"label 'target' has per-row shape \(3,\) but the model's output for "
                                              r"it has per-row shape \(2,\)"):
            conv.align(out, conv.tensor(np.zeros((4, 3), dtype=np.float32)))
    with pytest.raises(TypeError):  # from torch.from_numpy, as _tensor raised it
        conv.tensor(np.array(["a", "b"]))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.steps = torch.nn.Parameter(torch.zeros(1, dtype=torch.int64), requires_grad=False)  # not floating
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def forward(self, x):
        return self.body(x)


def test_param_dtype_follows_the_model_between_calls():
    net = Net()
    dtype = ParamDtype(net)
    assert dtype() == _param_dtype(net) == torch.float32
    assert dtype._param is not None and dtype._param[2] is net.body[0].weight
    for convert, want in ((torch.nn.Module.double, torch.float64), (torch.nn.Module.half, torch.float16),
                          (torch.nn.Module.float, torch.float32)):
        convert(net)
        assert dtype() == _param_dtype(net) == want
    net.body[0] = torch.nn.Linear(4, 8).double()  # a module on the kept chain replaced
    assert dtype() == _param_dtype(net) == torch.float64
    net.body[0].weight = torch.nn.Parameter(torch.zeros(8, 4, dtype=torch.bfloat16))  # the kept parameter replaced
    assert dtype() == _param_dtype(net) == torch.bfloat16
    net.body[0].weight.requires_grad_(False)
    net.body[0].weight.data = torch.zeros(8, 4, dtype=torch.int32)  # no longer floating: the next one is first
    assert dtype() == _param_dtype(net) == torch.float64


def test_param_dtype_sees_parameters_replaced_by_torchs_conversion_setting():
    net = Net()
    dtype = ParamDtype(net)
    assert dtype() == torch.float32
    before = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        weight = net.body[0].weight
        net.double()  # new Parameter objects
        assert net.body[0].weight is not weight
        assert dtype() == _param_dtype(net) == torch.float64
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(before)


def test_param_dtype_without_floating_parameters_or_with_its_own_parameters_method():
    class NoFloats(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.count = torch.nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False)

    class OwnParameters(torch.nn.Module):  # parameters() that named_parameters() does not name
        def __init__(self) -> None:
            super().__init__()
            self.hidden = [torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))]

        def parameters(self, recurse=True):
            return iter(self.hidden)

    none, own = ParamDtype(NoFloats()), ParamDtype(OwnParameters())
    for _ in range(2):
        assert none() == torch.float32 and own() == torch.float64
    assert none._param is None and own._param is None  # nothing kept: each call searches


def test_to_inputs_with_a_known_dtype_is_to_inputs():
    net = torch.nn.Linear(4, 1).double()
    rows = np.empty(3, dtype=object)  # a column of arrays, as pandas holds vectors
    for i in range(3):
        rows[i] = np.ones(4, dtype=np.float32)
    arrays = [np.ones((3, 4), dtype=np.float32), np.ones((3, 4), dtype=np.float64), np.ones((3, 4), dtype=bool),
              np.ones((3, 4), dtype=np.int32), rows]
    plain = to_inputs(net, arrays, None)
    known = to_inputs(net, arrays, None, dtype=torch.float64)
    assert [t.dtype for t in known] == [t.dtype for t in plain] == [torch.float64] * 3 + [torch.int32, torch.float64]
    assert all(torch.equal(a, b) for a, b in zip(plain, known))
    same = np.ones((3, 4))  # float64 already: no copy, the array's memory
    same[0, 0] = 7.0
    assert to_inputs(net, [same], None, dtype=torch.float64)[0][0, 0].item() == 7.0
    with pytest.raises(DataError, match=r"feature 0 with batch shape \(3, 4\) cannot be reshaped to input_shapes\[0\]"):
        to_inputs(net, [same], [[-1, 5]], dtype=torch.float64)


@pytest.mark.parametrize("loss", [torch.tensor(0.1234567, dtype=torch.float32),
                                  torch.tensor(1e-30, dtype=torch.float64), torch.tensor(3.5, dtype=torch.bfloat16),
                                  torch.tensor([2.25]), torch.tensor(float("nan")), torch.tensor(7, dtype=torch.int64)])
def test_loss_value_is_float_of_the_detached_loss(loss):
    want = float(loss.detach())
    got = loss_value(loss.requires_grad_() if loss.is_floating_point() else loss)
    assert type(got) is float and (got == want or (got != got and want != want))


def test_loss_value_of_a_number_and_of_several_values():
    assert loss_value(1.5) == 1.5
    with pytest.raises(ValueError, match="only one element tensors can be converted to Python scalars"):
        loss_value(torch.ones(3))


class LocalSession(TorchSession):
    """A session outside a job: rank 0 without hora.init (the step's errors name the rank)."""

    rank = 0


def _session(model, **kw):
    args = dict(hvd=None, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                losses=[torch.nn.MSELoss()], metrics=[], feature_keys=("x",), label_cols=("y",), loss_weights=[1.0])
    args.update(kw)
    return LocalSession(**args)


def _reference_loss(session, batch):
    """The step's loss as the session computed it per batch before (to_inputs, align_label, the loss)."""
    inputs = to_inputs(session.model, [batch[k] for k in session.feature_keys], session.input_shapes)
    labels = [_tensor(_stack(batch[name])) for name in session.label_cols]
    outs = session.model(*inputs)
    outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
    labels = [reference_align_label(o, t, name) for o, t, name in zip(outs, labels, session.label_cols)]
    return session._loss(outs, labels, None)


def _batch(n, seed, label_dtype=np.float32, label_shape=None):
    rng = np.random.default_rng(seed)
    x = rng.random((n, 4), dtype=np.float32)
    y = x.sum(axis=1).astype(label_dtype)
    return {"x": x, "y": y if label_shape is None else y.reshape(label_shape)}


def test_training_steps_give_the_reference_losses_and_weights_through_every_change():
    """Two identical models, one trained by the session, one by the per-batch reference step:
    the same loss at every step and the same weights after, through a smaller batch, labels
    of other dtypes and shapes, and the model converted to float64 between steps."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    twin = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    twin.load_state_dict(model.state_dict())
    session, twin_opt = _session(model), torch.optim.SGD(twin.parameters(), lr=0.01)
    twin_session = _session(twin)
    batches = [_batch(16, 0), _batch(16, 1), _batch(5, 2), _batch(16, 3, np.float64), _batch(16, 4),
               _batch(16, 5, label_shape=(16, 1)), "double", _batch(16, 6), _batch(16, 7), _batch(5, 8)]
    for step, batch in enumerate(batches):
        if batch == "double":
            model.double()
            twin.double()
            continue
        got = session.train_step(batch, step)
        twin_opt.zero_grad()
        want = _reference_loss(twin_session, batch)
        want.backward()
        twin_opt.step()
        assert got == float(want.detach()), step
    for p, q in zip(model.parameters(), twin.parameters()):
        assert p.dtype == q.dtype == torch.float64 and torch.equal(p, q)


def test_eval_batches_and_errors_of_the_session():
    torch.manual_seed(0)
    session = _session(torch.nn.Linear(4, 3), losses=[torch.nn.CrossEntropyLoss()],
                       metrics=[("acc", lambda o, t: (o.argmax(1) == t).float(), 0)])
    ids = {"x": np.ones((6, 4), dtype=np.float32), "y": np.array([0, 1, 2, 0, 1, 2], dtype=np.float64)}
    for _ in range(2):
        result = session.eval_batch(ids)
        assert result["_n"] == 6.0 and set(result) == {"loss", "_n", "acc"}
    with pytest.raises(ConfigError, match=r"label 'y' has per-row shape \(\) but the model's output for it has "
                                          r"per-row shape \(3,\)"):
        session.eval_batch({**ids, "y": ids["y"] + 0.5})
    wrong = _session(torch.nn.Linear(4, 2))
    for step in range(2):
        with pytest.raises(ConfigError, match=r"label 'y' has per-row shape \(3,\) but the model's output for it "
                                              r"has per-row shape \(2,\)"):
            wrong.train_step({"x": np.ones((4, 4), dtype=np.float32), "y": np.ones((4, 3), dtype=np.float32)}, step)
    two = _session(torch.nn.Linear(4, 1), label_cols=("y", "z"), loss_weights=[1.0, 1.0])
    with pytest.raises(ConfigError, match="the model returns 1 outputs but there are 2 label_cols"):
        two.train_step({"x": np.ones((4, 4), dtype=np.float32), "y": np.ones(4, dtype=np.float32),
                        "z": np.ones(4, dtype=np.float32)}, 0)
    nan = _session(torch.nn.Linear(4, 1))
    with pytest.raises(DataError, match="training loss became nan at step 3 on rank 0"):
        nan.train_step({"x": np.full((4, 4), np.nan, dtype=np.float32), "y": np.ones(4, dtype=np.float32)}, 3)
