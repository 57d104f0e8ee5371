"""Module-level functions run on every rank by tests/torch (spawn needs importable code),
and the single-process references they are compared against.

One launch runs every scenario in sequence (launching processes is the expensive part on
a 2-core machine); each scenario's outcome, or its traceback, is returned separately so
the tests report failures one by one.
"""

from __future__ import annotations

import copy
import pickle
import traceback
from collections.abc import Callable
from typing import Any

import torch

from hora.errors import ConfigError

IN, HID, OUT = 8, 16, 4
GLOBAL_BATCH = 16
STEPS = 4


# ---------------------------------------------------------------------------- data, models
def make_data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, IN, generator=g)
    y = torch.randn(GLOBAL_BATCH, OUT, generator=g)
    return x, y


def make_mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.Tanh(), torch.nn.Linear(HID, OUT))


def make_optimizer(kind: str, params: Any) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
    if kind == "plain_sgd":
        return torch.optim.SGD(params, lr=0.1)
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.01)
    raise ValueError(kind)


class TwoHeads(torch.nn.Module):
    """head_b only takes part for the samples that ask for it (a branch not always taken)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = torch.nn.Linear(IN, HID)
        self.head_a = torch.nn.Linear(HID, OUT)
        self.head_b = torch.nn.Linear(HID, OUT)

    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        out = self.head_a(h)
        return out + self.head_b(h) if use_b else out


def uses_b(step: int, sample_half: int) -> bool:
    """Step 1: nobody uses head_b; otherwise only the first half of the batch does."""
    return step != 1 and sample_half == 0


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------- references
def reference_train(opt_kind: str, steps: int = STEPS, loss_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """One process, whole batch, mean loss: what 2 ranks on half batches must reproduce."""
    model = make_mlp(seed=0)
    opt = make_optimizer(opt_kind, model.parameters())
    for step in range(steps):
        x, y = make_data(step)
        opt.zero_grad()
        (torch.nn.functional.mse_loss(model(x), y) * loss_scale).backward()
        opt.step()
    return state(model)


def reference_scheduled_closure(steps: int = STEPS) -> dict[str, Any]:
    """One process, whole batch: SGD stepped through a closure, a StepLR halving the rate."""
    model = make_mlp(seed=0)
    opt = make_optimizer("plain_sgd", model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    losses = []
    for step in range(steps):
        x, y = make_data(step)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        losses.append(opt.step(closure).item())
        sched.step()
    return {"state": state(model), "losses": losses}


def reference_two_heads(steps: int = STEPS) -> dict[str, torch.Tensor]:
    model = TwoHeads(seed=0)
    opt = make_optimizer("plain_sgd", model.parameters())
    half = GLOBAL_BATCH // 2
    for step in range(steps):
        x, y = make_data(step)
        opt.zero_grad()
        losses = []
        for h in range(2):
            sl = slice(h * half, (h + 1) * half)
            losses.append(torch.nn.functional.mse_loss(model(x[sl], uses_b(step, h)), y[sl]))
        (sum(losses) / 2).backward()
        opt.step()
    return state(model)


def sync_bn_input(shape: tuple[int, ...] = (3, 5)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(GLOBAL_BATCH, *shape, generator=g) * 3 + 1.5
    w = torch.randn(GLOBAL_BATCH, *shape, generator=g)
    return x, w


def make_bn(two_d: bool) -> torch.nn.Module:
    """BatchNorm1d on (N, 3, 5), or BatchNorm2d with cumulative averaging on (N, 3, 4, 2)."""
    return torch.nn.BatchNorm2d(3, momentum=None) if two_d else torch.nn.BatchNorm1d(3)


def reference_sync_bn(two_d: bool = False) -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    bn = make_bn(two_d)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    x, w = sync_bn_input((3, 4, 2) if two_d else (3, 5))
    x = x.clone().requires_grad_(True)
    y = None
    for _ in range(2):
        y = bn(x)
        (y * w).sum().backward()
    bn.eval()
    return {
        "y": y.detach(), "x_grad": x.grad.detach(), "weight_grad": bn.weight.grad.detach(),
        "bias_grad": bn.bias.grad.detach(), "running_mean": bn.running_mean.clone(),
        "running_var": bn.running_var.clone(), "eval_y": bn(x).detach(),
    }


# ---------------------------------------------------------------------------- on each rank
def _my_half(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    n = t.shape[0] // size
    return t[rank * n : (rank + 1) * n]


def _train_distributed(hvd, opt_kind: str, bpps: int = 1, set_to_none: bool = True,
                       **opt_kwargs) -> dict[str, torch.Tensor]:
    rank, size = hvd.rank(), hvd.size()
    model = make_mlp(seed=rank)  # different start on purpose: broadcast_parameters fixes it
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = make_optimizer(opt_kind, model.parameters())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   backward_passes_per_step=bpps, **opt_kwargs)
    for step in range(STEPS):
        x, y = make_data(step)
        x, y = _my_half(x, rank, size), _my_half(y, rank, size)
        opt.zero_grad(set_to_none=set_to_none)
        for mx, my in zip(x.chunk(bpps), y.chunk(bpps), strict=True):
            (torch.nn.functional.mse_loss(model(mx), my) / bpps).backward()
        opt.step()
    return state(model)


def _scenario_two_heads(hvd) -> dict[str, torch.Tensor]:
    rank, size = hvd.rank(), hvd.size()
    model = TwoHeads(seed=0)
    opt = hvd.DistributedOptimizer(make_optimizer("plain_sgd", model.parameters()),
                                   named_parameters=model.named_parameters())
    for step in range(STEPS):
        x, y = make_data(step)
        x, y = _my_half(x, rank, size), _my_half(y, rank, size)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x, uses_b(step, rank)), y).backward()
        opt.step()
    return state(model)


def _scenario_scheduled_closure(hvd) -> dict[str, Any]:
    """An LR scheduler made *before* wrapping (as Lightning does) and step(closure): the
    wrapper must still synchronize (the scheduler's step wrapper is bound to the raw
    optimizer), the closure's gradients must be the ones reduced, and the scheduler must
    not warn that it stepped first."""
    import warnings

    rank, size = hvd.rank(), hvd.size()
    model = make_mlp(seed=0)
    raw = make_optimizer("plain_sgd", model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(raw, step_size=1, gamma=0.5)
    opt = hvd.DistributedOptimizer(raw, named_parameters=model.named_parameters())
    losses, lrs = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(STEPS):
            x, y = make_data(step)
            x, y = _my_half(x, rank, size), _my_half(y, rank, size)

            def closure() -> torch.Tensor:
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss

            losses.append(float(hvd.allreduce(opt.step(closure).detach(), name=f"closure.loss.{step}")))
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
    return {"state": state(model), "losses": losses, "lrs": lrs,
            "warnings": [str(w.message) for w in caught if "lr_scheduler" in str(w.message)]}


def _scenario_overlap(hvd) -> dict[str, Any]:
    """DistributedOptimizer (hooks, async, fused) vs a hand-written non-overlapped path:
    backward with no hooks, then one blocking allreduce per gradient, then step."""
    rank, size = hvd.rank(), hvd.size()
    plain = make_mlp(seed=0)
    popt = make_optimizer("sgd", plain.parameters())
    model = make_mlp(seed=0)
    opt = hvd.DistributedOptimizer(make_optimizer("sgd", model.parameters()),
                                   named_parameters=model.named_parameters())
    in_flight_after_backward = []
    for step in range(STEPS):
        x, y = make_data(step)
        x, y = _my_half(x, rank, size), _my_half(y, rank, size)
        popt.zero_grad()
        torch.nn.functional.mse_loss(plain(x), y).backward()
        for name, p in plain.named_parameters():
            hvd.allreduce_(p.grad, op=hvd.Average, name=f"manual.{name}")
        popt.step()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        # every gradient was submitted by its hook during backward, before step() (a flat
        # bucket's handle is keyed by the bucket's index)
        in_flight_after_backward.append(sorted(
            opt._hora_names[p] for key in opt._hora_handles
            for p in (opt._hora_buckets[key] if isinstance(key, int) else [key])))
        opt.step()
    return {"overlapped": state(model), "manual": state(plain), "in_flight": in_flight_after_backward,
            "names": sorted(n for n, _ in model.named_parameters())}


def _scenario_process_set(hvd) -> dict[str, Any]:
    """A process set of rank 0 alone: rank 0 (a set of one) and rank 1 (not a member)
    both step on their own gradients, with nothing to wait for."""
    rank, size = hvd.rank(), hvd.size()
    ps = hvd.add_process_set([0])
    try:
        model = make_mlp(seed=0)
        opt = hvd.DistributedOptimizer(make_optimizer("sgd", model.parameters()),
                                       named_parameters=model.named_parameters(), process_set=ps)
        local = make_mlp(seed=0)
        lopt = make_optimizer("sgd", local.parameters())
        for step in range(STEPS):
            x, y = make_data(step)
            x, y = _my_half(x, rank, size), _my_half(y, rank, size)
            for m, o in ((model, opt), (local, lopt)):
                o.zero_grad()
                torch.nn.functional.mse_loss(m(x), y).backward()
                o.step()
        return {"distributed": state(model), "local": state(local)}
    finally:
        hvd.remove_process_set(ps)


def _scenario_optimizer_state(hvd) -> dict[str, Any]:
    rank = hvd.rank()
    out: dict[str, Any] = {}
    # Adam: the root has stepped (lazy state exists), rank 1 is fresh with another lr
    model = make_mlp(seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=0.05 if rank == 0 else 0.9, betas=(0.8, 0.99) if rank == 0 else (0.5, 0.5))
    if rank == 0:
        for step in range(2):
            x, y = make_data(step)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    out["adam"] = opt.state_dict()
    # SGD with momentum wrapped in DistributedOptimizer: rank 1 has state, root has none
    model = make_mlp(seed=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    if rank == 1:
        for p in model.parameters():
            opt.state[p]["momentum_buffer"] = torch.ones_like(p)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    out["sgd_empty_root"] = {k: len(v) for k, v in opt.state_dict().items() if k == "state"}
    # root rank 1 this time, for the param groups' hyperparameters
    opt.param_groups[0]["lr"] = 0.25 if rank == 1 else 0.1
    hvd.broadcast_optimizer_state(opt, root_rank=1)
    out["lr_from_rank1"] = opt.param_groups[0]["lr"]
    return out


def _scenario_sync_bn(hvd, two_d: bool = False) -> dict[str, Any]:
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(3)
    ref = make_bn(two_d)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    bn = hvd.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(ref))[0]
    assert isinstance(bn, hvd.SyncBatchNorm), type(bn)
    x, w = sync_bn_input((3, 4, 2) if two_d else (3, 5))
    x = _my_half(x, rank, size).clone().requires_grad_(True)
    w = _my_half(w, rank, size)
    y = None
    for _ in range(2):
        y = bn(x)
        (y * w).sum().backward()
    bn.eval()
    return {
        "y": y.detach(), "x_grad": x.grad.detach(),
        "weight_grad": hvd.allreduce(bn.weight.grad.detach(), op=hvd.Sum, name="t.wg"),
        "bias_grad": hvd.allreduce(bn.bias.grad.detach(), op=hvd.Sum, name="t.bg"),
        "running_mean": bn.running_mean.clone(), "running_var": bn.running_var.clone(),
        "eval_y": bn(x).detach(),
    }


def _scenario_bucket_views(hvd) -> dict[str, Any]:
    """After step() every .grad is a view of its bucket's one buffer, holding the average."""
    rank, size = hvd.rank(), hvd.size()
    model = make_mlp(seed=0)
    opt = hvd.DistributedOptimizer(make_optimizer("plain_sgd", model.parameters()),
                                   named_parameters=model.named_parameters())
    x, y = make_data(0)
    x, y = _my_half(x, rank, size), _my_half(y, rank, size)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    grads = [p.grad for p in model.parameters()]
    return {"storages": len({g.untyped_storage().data_ptr() for g in grads}),
            "grads": [g.clone() for g in grads], "buckets": len(opt._hora_buckets)}


class _Pair(torch.nn.Module):
    """Two same-shaped layers, registered in the order given (same names either way)."""

    def __init__(self, order: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        layers = {"a": torch.nn.Linear(4, 4), "b": torch.nn.Linear(4, 4)}
        for name in order:
            self.add_module(name, layers[name])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def _scenario_layout_mismatch(hvd) -> dict[str, Any]:
    """Rank 1 registers the layers in the other order: flat buckets would add up different
    parameters, so the first step refuses; matching by name (the Horovod way) works."""
    out: dict[str, Any] = {}
    for by_view in (True, False):
        model = _Pair("ab" if hvd.rank() == 0 else "ba")
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), gradient_as_bucket_view=by_view)
        try:
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            out[by_view] = "ok"
        except ConfigError as exc:
            out[by_view] = str(exc)
    return out


def _scenario_misuse(hvd) -> dict[str, Any]:
    """zero_grad between backward and step; more passes than backward_passes_per_step."""
    rank, size = hvd.rank(), hvd.size()
    model = make_mlp(seed=0)
    opt = hvd.DistributedOptimizer(make_optimizer("plain_sgd", model.parameters()),
                                   named_parameters=model.named_parameters(), backward_passes_per_step=2)
    x, y = make_data(0)
    x, y = _my_half(x, rank, size), _my_half(y, rank, size)
    out: dict[str, Any] = {}
    for _ in range(2):
        torch.nn.functional.mse_loss(model(x), y).backward()
    opt.zero_grad()  # 2 passes submitted everything: completes them, then clears
    out["grads_after_zero_grad"] = [p.grad for p in model.parameters()]
    for _ in range(2):
        torch.nn.functional.mse_loss(model(x), y).backward()
    try:
        torch.nn.functional.mse_loss(model(x), y).backward()
        out["third_pass"] = "no error"
    except Exception as exc:  # noqa: BLE001 - the test checks type and message
        out["third_pass"] = (type(exc).__name__, str(exc))
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()
    out["weights"] = state(model)
    return out


def _scenario_elastic_state(hvd) -> dict[str, Any]:
    from hora.torch.elastic import TorchState

    rank, size = hvd.rank(), hvd.size()
    model = make_mlp(seed=rank)
    opt = hvd.DistributedOptimizer(make_optimizer("adam", model.parameters()),
                                   named_parameters=model.named_parameters())
    st = TorchState(model, opt, epoch=10 + rank, history=[rank])
    st.sync()  # rank 0's weights, (empty) optimizer state and attributes everywhere

    def train(step: int) -> None:
        x, y = make_data(step)
        x, y = _my_half(x, rank, size), _my_half(y, rank, size)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    out: dict[str, Any] = {"synced": (state(model), st.epoch, list(st.history))}
    train(0)
    st.epoch += 1
    st.history.append("a")
    st.commit()
    out["committed"] = (state(model), copy.deepcopy(opt.state_dict()), st.epoch, list(st.history))
    train(1)
    st.epoch += 1
    st.history.append("b")
    st.restore()
    out["restored"] = (state(model), opt.state_dict(), st.epoch, list(st.history))
    return out


def _scenario_objects(hvd) -> dict[str, Any]:
    rank = hvd.rank()
    return {
        "broadcast": hvd.broadcast_object({"from": rank, "data": [1, 2]} if rank == 1 else None, root_rank=1),
        "allgather": hvd.allgather_object(("rank", rank)),
        "size": hvd.size(),
    }


SCENARIOS: dict[str, Callable[[Any], Any]] = {
    "sgd": lambda hvd: _train_distributed(hvd, "sgd"),
    "adam": lambda hvd: _train_distributed(hvd, "adam"),
    "sgd_bpps2": lambda hvd: _train_distributed(hvd, "sgd", bpps=2),
    "adam_bpps2": lambda hvd: _train_distributed(hvd, "adam", bpps=2),
    "buckets": lambda hvd: _train_distributed(hvd, "adam", bucket_cap_mb=0.0005),
    "predivide": lambda hvd: _train_distributed(hvd, "sgd", gradient_predivide_factor=2.0),
    "sum_op": lambda hvd: _train_distributed(hvd, "plain_sgd", op=hvd.Sum),
    "per_name": lambda hvd: _train_distributed(hvd, "sgd", gradient_as_bucket_view=False),
    "keep_grads": lambda hvd: _train_distributed(hvd, "sgd", set_to_none=False),
    "adam_keep_grads_bpps2": lambda hvd: _train_distributed(hvd, "adam", bpps=2, set_to_none=False),
    "fp16": lambda hvd: _train_distributed(hvd, "sgd", compression=hvd.Compression.fp16),
    "bf16": lambda hvd: _train_distributed(hvd, "sgd", compression=hvd.Compression.bf16),
    "two_heads": _scenario_two_heads,
    "scheduled_closure": _scenario_scheduled_closure,
    "process_set": _scenario_process_set,
    "overlap": _scenario_overlap,
    "optimizer_state": _scenario_optimizer_state,
    "sync_bn": _scenario_sync_bn,
    "sync_bn2d": lambda hvd: _scenario_sync_bn(hvd, two_d=True),
    "misuse": _scenario_misuse,
    "bucket_views": _scenario_bucket_views,
    "layout_mismatch": _scenario_layout_mismatch,
    "objects": _scenario_objects,
    "elastic_state": _scenario_elastic_state,
}


def run_all_scenarios() -> bytes:
    """Entry point on each rank: pickled ``{scenario: (ok, result or traceback)}``.

    Pickled here with plain pickle: tensors put as-is on a multiprocessing queue travel
    as shared-memory handles that die with this process."""
    torch.set_num_threads(1)
    import hora.torch as hvd

    hvd.init()
    results: dict[str, tuple[bool, Any]] = {}
    try:
        for name, fn in SCENARIOS.items():
            try:
                results[name] = (True, fn(hvd))
            except Exception:  # noqa: BLE001 - reported per scenario to the test
                results[name] = (False, traceback.format_exc())
            hvd.barrier()
    finally:
        hvd.shutdown()
    return pickle.dumps(results)


def fsdp_cpu_model_on_an_accelerator_host() -> tuple[set[str], float]:
    """``prepare("fsdp")`` of a CPU model on a host whose default accelerator is CUDA (made to look
    so: ``torch._C._get_accelerator``, which FSDP2's default mesh follows): the mesh is the model's
    own device's, so the shards are gathered over Gloo, not NCCL. Returns the mesh device types
    of the parameters and the loss after two steps."""
    torch.set_num_threads(1)
    import hora.torch as hvd
    from hora.estimators.frameworks.torch.strategies import prepare

    hvd.init()
    real = torch._C._get_accelerator
    torch._C._get_accelerator = lambda: torch.device("cuda")
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        module, opt = prepare("fsdp", hvd, model, torch.optim.SGD(model.parameters(), lr=0.1), {})
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(hvd.rank()))
        for _ in range(2):
            opt.zero_grad()
            loss = module(x).square().mean()
            loss.backward()
            opt.step()
        return {p.device_mesh.device_type for p in module.parameters()}, float(loss)
    finally:
        torch._C._get_accelerator = real
        hvd.shutdown()
