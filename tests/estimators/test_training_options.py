"""The options of a modern training loop on TorchEstimator: lr_scheduler (its state
continued by a resume and by a relaunch), precision (bf16 and float16 autocast on the CPU, float16's GradScaler
checkpointed and its skipped steps alike on every rank), gradient clipping on the
allreduced gradients, class_weight, and callbacks that see the model and the optimizer. Real ranks on
local processes (a pandas frame)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from hora.errors import ConfigError
from hora.estimators.callbacks import Callback

pytestmark = [pytest.mark.timeout(600)]


def _frame(n: int = 128, seed: int = 0, classes: int = 2) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int64") + ((x[:, 1] > 0.8) if classes > 2 else 0)
    return pd.DataFrame({"features": list(x), "y": y.astype("float64"), "w": rng.uniform(0.5, 2.0, n)})


def _net(out: int = 2, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, out))


def _est(store, **kw):
    from hora.dask import TorchEstimator

    net = kw.pop("model", None) or _net(kw.pop("out", 2))
    args = dict(num_proc=2, store=store, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                loss=torch.nn.CrossEntropyLoss(), feature_cols=["features"], label_cols=["y"], batch_size=16,
                epochs=3, random_seed=0, verbose=0, lr_scaling="none")
    args.update(kw)
    return TorchEstimator(**args)


class Probe(Callback):
    """Puts into each epoch's logs what the callback sees: the learning rate after the epoch, the
    largest gradient norm / value after any step of the epoch, and whether it saw hora's optimizer."""

    def on_epoch_begin(self, ctx, epoch):
        self.norm, self.value = 0.0, 0.0

    def on_batch_end(self, ctx, step, logs):
        grads = [p.grad for p in ctx.model.parameters() if p.grad is not None]
        self.norm = max(self.norm, float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads))))
        self.value = max(self.value, max(float(g.abs().max()) for g in grads))

    def on_epoch_end(self, ctx, epoch, logs):
        logs["lr"] = ctx.optimizer.param_groups[0]["lr"]
        logs["grad_norm_max"], logs["grad_value_max"] = self.norm, self.value
        logs["hora_optimizer"] = float(hasattr(ctx.optimizer, "synchronize") and hasattr(ctx.optimizer,
                                                                                        "skip_synchronize"))
        logs["is_module"] = float(isinstance(ctx.model, torch.nn.Module))


def _state(fitted) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in fitted.model_.state_dict().items()}


def _lambda_schedule(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.9 ** i)


@pytest.mark.timeout(900)
def test_scheduler_state_continues_after_a_resume_and_a_relaunch(store, tmp_path):
    from tests.estimators.recovery_callbacks import KillRank

    df = _frame()
    opts = dict(lr_scheduler=_lambda_schedule, lr_scheduler_interval="step", epochs=4)
    whole = _est(store, run_id="sched-whole", callbacks=[Probe()], **opts).fit(df)
    steps = 128 // 2 // 16  # batches per rank and epoch
    lrs = [h["lr"] for h in whole.history_]
    np.testing.assert_allclose(lrs, [0.1 * 0.9 ** (steps * (e + 1)) for e in range(4)], rtol=1e-9)
    assert {h["hora_optimizer"] for h in whole.history_} == {1.0} and {h["is_module"] for h in whole.history_} == {1.0}

    # a resume: the same run fitted for 2 epochs, then again for 4 (from the checkpoint of epoch 2)
    _est(store, run_id="sched-resume", callbacks=[Probe()], **{**opts, "epochs": 2}).fit(df)
    resumed = _est(store, run_id="sched-resume", callbacks=[Probe()], **opts).fit(df)
    assert [h["lr"] for h in resumed.history_] == pytest.approx(lrs, rel=1e-12)
    for name, value in _state(whole).items():
        np.testing.assert_allclose(_state(resumed)[name], value, rtol=1e-5, atol=1e-6)

    # a relaunch: rank 1 killed mid-epoch 2, checkpoints every step; attempt 2 continues the schedule
    relaunched = _est(store, run_id="sched-relaunch", callbacks=[Probe(), KillRank(rank=1, epoch=2, step=2)],
                      max_failures=1, checkpoint_every="1 step", **opts).fit(df)
    assert [h["attempt"] for h in relaunched.history_] == [1, 1, 2, 2]
    assert [h["lr"] for h in relaunched.history_] == pytest.approx(lrs, rel=1e-12)
    for name, value in _state(whole).items():
        np.testing.assert_allclose(_state(relaunched)[name], value, rtol=1e-5, atol=1e-6)


def test_epoch_scheduler_and_reduce_on_plateau(store):
    df = _frame()
    fit = _est(store, callbacks=[Probe()], lr_scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5),
               epochs=3).fit(df)
    assert [h["lr"] for h in fit.history_] == pytest.approx([0.05, 0.025, 0.0125])
    # ReduceLROnPlateau steps with the epoch's loss: a learning rate of 1e-6 does not improve it by 1e-4
    fit = _est(store, callbacks=[Probe()], optimizer=lambda p: torch.optim.SGD(p, lr=1e-6), epochs=3,
               lr_scheduler=lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, factor=0.1, patience=0)).fit(df)
    assert fit.history_[-1]["lr"] == pytest.approx(1e-8)  # reduced twice


def test_bf16_autocast_on_cpu_trains_close_to_fp32(store):
    class Net(torch.nn.Module):
        """Records in a buffer whether its hidden layer computed in bfloat16 during training."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.body = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
            self.register_buffer("saw_bf16", torch.zeros(()))

        def forward(self, x):
            out = self.body(x)
            if self.training and out.dtype == torch.bfloat16:
                self.saw_bf16.fill_(1.0)
            return out

    df = _frame(n=256)
    fp32 = _est(store, model=Net(), epochs=4, validation=0.25).fit(df)
    bf16 = _est(store, model=Net(), epochs=4, validation=0.25, precision="bf16-mixed").fit(df)
    assert float(bf16.model_.saw_bf16) == 1.0 and float(fp32.model_.saw_bf16) == 0.0
    assert bf16.history_[-1]["val_loss"] < bf16.history_[0]["val_loss"]
    assert bf16.history_[-1]["val_loss"] == pytest.approx(fp32.history_[-1]["val_loss"], rel=0.05, abs=0.01)
    assert bf16.model_.body[0].weight.dtype == torch.float32  # the weights stay float32


class _InfGrad(torch.autograd.Function):
    """The identity forward; an inf (or NaN) gradient backward: a float16 overflow as the GradScaler sees one."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * float("inf")


class Fp16Net(torch.nn.Module):
    """Records in a buffer whether its output was float16 in training; ``poison=(rank, call)``: that
    rank's ``call``-th training forward (1-based) gives its first layer an inf gradient."""

    def __init__(self, poison: tuple[int, int] | None = None):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        self.register_buffer("saw_fp16", torch.zeros(()))
        self.poison, self.calls = poison, 0

    def forward(self, x):
        hidden = self.body[0](x)
        if self.training:
            self.calls += 1
            if self.poison is not None and self.calls == self.poison[1]:
                import hora.torch as hvd

                if hvd.rank() == self.poison[0]:
                    hidden = _InfGrad.apply(hidden)
        out = self.body[2](self.body[1](hidden))
        if self.training and out.dtype == torch.float16:
            self.saw_fp16.fill_(1.0)
        return out


def _grad_scaler_state(store, run_id: str) -> dict:
    import io

    _, data = store.latest_checkpoint(run_id)
    return torch.load(io.BytesIO(data), weights_only=False)["grad_scaler"]


def test_float16_autocast_on_cpu_skips_an_inf_step_on_every_rank_and_resumes_its_grad_scaler(store, tmp_path):
    """precision='16-mixed' without a GPU: float16 autocast and a CPU GradScaler. Rank 1's 3rd step gets
    an inf gradient: the allreduce carries it to rank 0, both ranks' scalers skip that step and halve the
    scale, both end with the same weights. Resumed from its checkpoint, the fit continues that scaler (a
    fresh one would start again at 65536), and trains to within tolerance of float32."""
    from tests.estimators.recovery_callbacks import WeightsProbe

    df = _frame(n=256)  # 8 full batches of 16 per rank and epoch
    fp32 = _est(store, model=Fp16Net(), epochs=4).fit(df)
    _est(store, model=Fp16Net(poison=(1, 3)), epochs=2, precision="16-mixed", run_id="fp16",
         callbacks=[WeightsProbe(str(tmp_path))]).fit(df)
    half = _grad_scaler_state(store, "fp16")
    assert half["scale"] == 32768.0  # halved once, by rank 0's scaler too, whose own gradients were finite
    assert half["_growth_tracker"] == 2 * 8 - 3  # counted again from the step after the skipped one
    assert len({(tmp_path / f"weights.{r}").read_text() for r in (0, 1)}) == 1  # the same weights on both ranks

    fp16 = _est(store, model=Fp16Net(), epochs=4, precision="16-mixed", run_id="fp16").fit(df)
    end = _grad_scaler_state(store, "fp16")
    assert (end["scale"], end["_growth_tracker"]) == (32768.0, 2 * 8 - 3 + 2 * 8)  # the restored scaler went on
    assert float(fp16.model_.saw_fp16) == 1.0 and float(fp32.model_.saw_fp16) == 0.0
    assert all(torch.isfinite(p).all() for p in fp16.model_.parameters())
    assert len(fp16.history_) == 4 and fp16.history_[-1]["loss"] < fp16.history_[0]["loss"]
    assert fp16.history_[-1]["loss"] == pytest.approx(fp32.history_[-1]["loss"], rel=0.05, abs=0.01)
    assert fp16.model_.body[0].weight.dtype == torch.float32  # the weights stay float32


def test_gradient_clipping_applies_to_the_allreduced_gradients(store):
    df = _frame()
    free = _est(store, callbacks=[Probe()], optimizer=lambda p: torch.optim.SGD(p, lr=0.5), epochs=1).fit(df)
    assert free.history_[0]["grad_norm_max"] > 0.2
    clipped = _est(store, callbacks=[Probe()], optimizer=lambda p: torch.optim.SGD(p, lr=0.5), epochs=1,
                   gradient_clip_norm=0.05).fit(df)
    assert clipped.history_[0]["grad_norm_max"] <= 0.05 * (1 + 1e-5)
    by_value = _est(store, callbacks=[Probe()], optimizer=lambda p: torch.optim.SGD(p, lr=0.5), epochs=1,
                    gradient_clip_value=0.01).fit(df)
    assert by_value.history_[0]["grad_value_max"] <= 0.01 + 1e-9
    # a huge learning rate with a norm bound stays finite (each step moves the weights by at most lr * bound)
    wild = _est(store, optimizer=lambda p: torch.optim.SGD(p, lr=50.0), loss=torch.nn.MSELoss(), out=1,
                epochs=2, gradient_clip_norm=1e-3, task="regression").fit(df)
    assert all(np.isfinite(h["loss"]) for h in wild.history_)
    assert all(np.isfinite(v).all() for v in _state(wild).values())


def test_class_weight_weights_each_row_by_its_class_and_combines_with_sample_weights(store):
    df = _frame(n=64, classes=3)
    weights = {0: 1.0, 1: 4.0, 2: 0.5}
    x = torch.tensor(np.stack(df["features"]))
    y = torch.tensor(df["y"].to_numpy()).long()

    def first_loss(**kw):
        # one rank, one batch of every row, a learning rate too small to move: the logged loss is the batch's
        fit = _est(store, num_proc=1, batch_size=64, epochs=1, out=3, shuffle=False,
                   optimizer=lambda p: torch.optim.SGD(p, lr=1e-30), **kw).fit(df)
        return fit.history_[0]["loss"], fit.model_

    plain, model = first_loss()
    weighted, _ = first_loss(class_weight=weights)
    with torch.no_grad():
        per_row = torch.nn.functional.cross_entropy(model(x), y, reduction="none").double()
        expected = torch.nn.functional.cross_entropy(model(x), y, weight=torch.tensor([1.0, 4.0, 0.5]))
    cw = torch.tensor([weights[i] for i in range(3)], dtype=torch.float64)[y]
    assert plain == pytest.approx(float(per_row.mean()), rel=1e-5)
    assert weighted == pytest.approx(float(expected), rel=1e-5)
    assert weighted == pytest.approx(float((per_row * cw).sum() / cw.sum()), rel=1e-5)
    assert abs(weighted - plain) > 1e-3
    both, _ = first_loss(class_weight=[1.0, 4.0, 0.5], sample_weight_col="w")
    sw = torch.tensor(df["w"].to_numpy())
    assert both == pytest.approx(float((per_row * cw * sw).sum() / (cw * sw).sum()), rel=1e-5)


def test_bad_options_fail_on_the_driver(store):
    df = _frame(n=32)
    with pytest.raises(ConfigError, match="precision must be one of"):
        _est(store, precision="fp8").fit(df)
    with pytest.raises(ConfigError, match="lr_scheduler_interval must be"):
        _est(store, lr_scheduler=_lambda_schedule, lr_scheduler_interval="batch").fit(df)
    with pytest.raises(ConfigError, match="gradient_clip_norm must be a number > 0"):
        _est(store, gradient_clip_norm=-1).fit(df)
    with pytest.raises(ConfigError, match="class_weight has 3 weights, but the model has 2 classes"):
        _est(store, class_weight=[1.0, 2.0, 3.0]).fit(df)
    with pytest.raises(ConfigError, match="class_weight applies to a classifier"):
        _est(store, class_weight={0: 2.0}, loss=torch.nn.MSELoss(), out=1).fit(df)
    with pytest.raises(ConfigError, match="train_minibatch_fn replaces it"):
        _est(store, gradient_clip_norm=1.0, train_minibatch_fn=lambda *a: None).fit(df)
    assert not store.exists("runs")


@pytest.fixture
def hvd_single():
    """``hora.torch`` initialized as a one-rank job in this process (no child interpreter to start);
    shut down afterwards."""
    import hora.torch as hvd
    from tests.single_rank import one_rank_job

    with one_rank_job(hvd):
        yield hvd


def test_grad_scaler_step_unscales_before_stepping(hvd_single):
    """The '16-mixed' step (scaled backward, synchronize, unscale, skip_synchronize step) with a CPU
    GradScaler standing in for the GPU's: the same weights as the plain step."""
    from hora.estimators.frameworks.torch.codec import TorchSession

    hvd = hvd_single
    batch = {"x": np.random.default_rng(0).normal(size=(8, 4)).astype("float32"),
             "y": np.array([0, 1] * 4, dtype="float64")}
    weights = []
    for scaler in (None, torch.amp.GradScaler("cpu", init_scale=1024.0)):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        session = TorchSession(hvd=hvd, model=model, optimizer=opt, losses=[torch.nn.CrossEntropyLoss()], metrics=[],
                               feature_keys=("x",), label_cols=("y",), loss_weights=[1.0], scaler=scaler)
        for step in range(3):
            session.train_step(batch, step)
        weights.append(model.weight.detach().clone())
        if scaler is not None:
            assert scaler.get_scale() == 1024.0, scaler.get_scale()  # finite gradients: the scale stays
    assert torch.allclose(weights[0], weights[1], rtol=1e-5, atol=1e-7), (weights[0] - weights[1]).abs().max()


def test_a_step_scheduler_steps_with_each_optimizer_step_of_accumulated_windows(hvd_single):
    """backward_passes_per_step=2 over 3 batches: a full window and the epoch's partial one, each one
    optimizer step and one scheduler step."""
    from hora.estimators.frameworks.torch.codec import TorchSession

    hvd = hvd_single
    batch = {"x": np.ones((4, 4), dtype="float32"), "y": np.array([0, 1, 0, 1], dtype="float64")}
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(), backward_passes_per_step=2)
    session = TorchSession(hvd=hvd, model=model, optimizer=opt, losses=[torch.nn.CrossEntropyLoss()], metrics=[],
                           feature_keys=("x",), label_cols=("y",), loss_weights=[1.0], backward_passes_per_step=2,
                           scheduler=torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5), scheduler_interval="step")
    for step in range(3):
        session.train_step(batch, step)
    session.finish_epoch(3)
    # two optimizer steps, two scheduler steps
    assert session.scheduler.last_epoch == 2 and opt.param_groups[0]["lr"] == 0.25, (
        session.scheduler.last_epoch, opt.param_groups[0]["lr"])
