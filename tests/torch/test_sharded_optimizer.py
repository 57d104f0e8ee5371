"""DistributedOptimizer(sharding="optimizer" | "gradients") (ZeRO stages 1 and 2) on real
processes over loopback Gloo: parameters after N steps equal the unsharded optimizer's
and a one-process reference (SGD with momentum, AdamW; one bucket and many; 2 and 3
ranks, the latter with uneven shards), optimizer state per rank about 1/N,
backward_passes_per_step=2, fp16 compression, clip_grad_norm_ equal to the unsharded
norm, gradients of other ranks' parameters freed under ZeRO-2, and a sharded checkpoint
saved at 2 ranks (to a folder and to a Store) resumed at 1 and at 2 ranks (and a
consolidated one into a plain optimizer). Argument errors are checked in this process or on the ranks."""

from __future__ import annotations

import os
import pickle
import traceback
from typing import Any

import pytest
import torch

from hora.errors import ConfigError
from hora.store import Store
from tests.rank_results import assert_close, result
from tests.spawn_util import run_ranks

IN, HID, OUT = 8, 24, 4
GLOBAL_BATCH = 12  # divisible by 1, 2 and 3 ranks
STEPS = 4
TINY_BUCKETS_MB = 0.0005  # ~520 bytes: nearly every parameter in a bucket of its own


def make_data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(500 + step)
    return torch.randn(GLOBAL_BATCH, IN, generator=g), torch.randn(GLOBAL_BATCH, OUT, generator=g)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.Tanh(), torch.nn.Linear(HID, HID), torch.nn.Tanh(),
                               torch.nn.Linear(HID, HID), torch.nn.Tanh(), torch.nn.Linear(HID, OUT))


def make_opt(kind: str, params: Any) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.05)
    raise ValueError(kind)


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def reference(kind: str, steps: int = STEPS, clip: float | None = None, start: int = 0,
              model: torch.nn.Module | None = None, opt: Any = None) -> tuple[dict, list[float]]:
    """One process, whole batch: what every distributed run must reproduce."""
    model = model or make_model()
    opt = opt or make_opt(kind, model.parameters())
    norms = []
    for step in range(start, start + steps):
        x, y = make_data(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
    return weights(model), norms


# ---------------------------------------------------------------------------- on every rank
def _train(hvd: Any, kind: str, sharding: str | None, steps: int = STEPS, bpps: int = 1,
           cap: float | None = None, compression: Any = None, clip: float | None = None,
           model: torch.nn.Module | None = None, opt: Any = None, start: int = 0) -> dict[str, Any]:
    rank, size = hvd.rank(), hvd.size()
    model = model or make_model()
    if opt is None:
        opt = hvd.DistributedOptimizer(make_opt(kind, model.parameters()), named_parameters=model.named_parameters(),
                                       backward_passes_per_step=bpps, bucket_cap_mb=cap, sharding=sharding,
                                       compression=compression or hvd.Compression.none)
        opt.param_groups[0]["lr"] *= 1 + hvd.rank()  # made equal again by the broadcast below
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    per = GLOBAL_BATCH // size
    norms, freed = [], True
    for step in range(start, start + steps):
        x, y = make_data(step)
        x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
        opt.zero_grad()
        for xs, ys in zip(x.chunk(bpps), y.chunk(bpps)):
            (torch.nn.functional.mse_loss(model(xs), ys) / bpps).backward()
        if clip is not None:
            if sharding is None:
                opt.synchronize()
                norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
            else:
                norms.append(float(opt.clip_grad_norm_(clip)))
            with opt.skip_synchronize():
                opt.step()
            continue
        if sharding == "gradients":
            opt.synchronize()
            owned = set(opt._hora_owned)
            freed = freed and all((p.grad is None) != (p in owned) for p in model.parameters())
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    state_numel = sum(v.numel() for st in opt.state.values() for v in st.values()
                      if isinstance(v, torch.Tensor) and v.dim() > 0)
    return {"weights": weights(model), "norms": norms, "state_numel": state_numel, "freed": freed}


def _scenarios(hvd: Any, ckpt: str) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def case(name: str, fn: Any) -> None:
        try:
            out[name] = (True, fn())
        except Exception:  # noqa: BLE001 - reported per scenario to the test
            out[name] = (False, traceback.format_exc())
        hvd.barrier()

    for kind in ("sgd", "adamw"):
        case(f"none-{kind}", lambda: _train(hvd, kind, None))
        for sharding in ("optimizer", "gradients"):
            case(f"{sharding}-{kind}", lambda: _train(hvd, kind, sharding))
            case(f"{sharding}-{kind}-tiny", lambda: _train(hvd, kind, sharding, cap=TINY_BUCKETS_MB))
    if hvd.size() == 2:
        for sharding in ("optimizer", "gradients"):
            case(f"{sharding}-bpps2", lambda: _train(hvd, "adamw", sharding, bpps=2, cap=TINY_BUCKETS_MB))
            case(f"{sharding}-clip", lambda: _train(hvd, "sgd", sharding, clip=0.05, cap=TINY_BUCKETS_MB))
            case(f"{sharding}-fp16", lambda: _train(hvd, "adamw", sharding, compression=hvd.Compression.fp16))
        case("none-fp16", lambda: _train(hvd, "adamw", None, compression=hvd.Compression.fp16))
        case("none-clip", lambda: _train(hvd, "sgd", None, clip=0.05, cap=TINY_BUCKETS_MB))
        case("save", lambda: _save_then_continue(hvd, ckpt))
        case("errors", lambda: _rank_errors(hvd))
    return out


def _save_then_continue(hvd: Any, ckpt: str) -> dict[str, Any]:
    """ZeRO-2 AdamW: 2 steps, a sharded and a consolidated checkpoint, 2 more steps."""
    model = make_model()
    opt = hvd.DistributedOptimizer(make_opt("adamw", model.parameters()), named_parameters=model.named_parameters(),
                                   bucket_cap_mb=TINY_BUCKETS_MB, sharding="gradients")
    _train(hvd, "adamw", "gradients", steps=2, model=model, opt=opt)
    opt.save_sharded_state_dict(os.path.join(ckpt, "opt"))
    opt.save_sharded_state_dict("zero/opt", store=Store.create(f"file://{ckpt}/store"))
    full = opt.consolidated_state_dict(to_rank=0)
    if hvd.rank() == 0:
        torch.save(model.state_dict(), os.path.join(ckpt, "model.pt"))
        torch.save(full, os.path.join(ckpt, "full.pt"))
    else:
        assert full is None
    return _train(hvd, "adamw", "gradients", steps=2, model=model, opt=opt, start=2)


def _resume(hvd: Any, ckpt: str, sharding: str) -> dict[str, Any]:
    """Load the model and the sharded optimizer saved at 2 ranks; 2 more steps."""
    model = make_model()
    model.load_state_dict(torch.load(os.path.join(ckpt, "model.pt")))
    opt = hvd.DistributedOptimizer(make_opt("adamw", model.parameters()), named_parameters=model.named_parameters(),
                                   sharding=sharding)
    if sharding == "optimizer":  # from the Store
        opt.load_sharded_state_dict("zero/opt", store=Store.create(f"file://{ckpt}/store"))
    else:
        opt.load_sharded_state_dict(os.path.join(ckpt, "opt"))
    return _train(hvd, "adamw", sharding, steps=2, model=model, opt=opt, start=2)


def _rank_errors(hvd: Any) -> list[str]:
    """Errors that need an initialized hora: messages, to be checked by the test."""
    msgs = []
    model = make_model()
    lbfgs = torch.optim.LBFGS(model.parameters())
    try:
        hvd.DistributedOptimizer(lbfgs, named_parameters=model.named_parameters(), sharding="optimizer")
    except ConfigError as exc:
        msgs.append(str(exc))
    opt = hvd.DistributedOptimizer(make_opt("adamw", model.parameters()), named_parameters=model.named_parameters(),
                                   sharding="optimizer")
    other = torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.Tanh(), torch.nn.Linear(HID, OUT))
    other_opt = hvd.DistributedOptimizer(make_opt("adamw", other.parameters()),
                                         named_parameters=[("enc." + n, p) for n, p in other.named_parameters()],
                                         sharding="optimizer")
    try:
        opt.load_state_dict(hvd.allgather_object(other_opt.state_dict()))
    except ConfigError as exc:
        msgs.append(str(exc))
    return msgs


def run_all(ckpt: str) -> bytes:
    torch.set_num_threads(1)
    import hora.torch as hvd

    hvd.init()
    try:
        return pickle.dumps(_scenarios(hvd, ckpt))
    finally:
        hvd.shutdown()


def run_resume(ckpt: str, sharding: str) -> bytes:
    torch.set_num_threads(1)
    import hora.torch as hvd

    hvd.init()
    try:
        return pickle.dumps(_resume(hvd, ckpt, sharding))
    finally:
        hvd.shutdown()


# ---------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("zero-ckpt"))


@pytest.fixture(scope="module")
def two(ckpt) -> list[dict]:
    return [pickle.loads(b) for b in run_ranks(run_all, 2, args=(ckpt,), timeout=280)]


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> list[dict]:
    return [pickle.loads(b) for b in run_ranks(run_all, 3, args=(str(tmp_path_factory.mktemp("z3")),), timeout=280)]


def assert_identical_on_ranks(values: list[dict], what: str) -> None:
    for r in range(1, len(values)):
        for k in values[0]["weights"]:
            assert torch.equal(values[0]["weights"][k], values[r]["weights"][k]), f"{what}: {k} rank 0 vs {r}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("sharding", ["optimizer", "gradients"])
@pytest.mark.parametrize("tiny", [False, True], ids=["one-bucket", "many-buckets"])
def test_sharded_parameters_equal_unsharded(two, three, nranks, kind, sharding, tiny):
    ranks = two if nranks == 2 else three
    name = f"{sharding}-{kind}" + ("-tiny" if tiny else "")
    got = result(ranks, name)
    assert_identical_on_ranks(got, name)
    unsharded = result(ranks, f"none-{kind}")[0]["weights"]
    assert_close(got[0]["weights"], unsharded, 1e-6, f"{name} vs unsharded")
    want, _ = reference(kind)
    assert_close(got[0]["weights"], want, 1e-5, f"{name} vs one process")
    start = weights(make_model())
    assert any((start[k] - want[k]).abs().max() > 1e-3 for k in want)  # training moved the weights


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("sharding", ["optimizer", "gradients"])
def test_optimizer_state_is_split_across_ranks(two, three, nranks, sharding):
    ranks = two if nranks == 2 else three
    full = result(ranks, "none-adamw")[0]["state_numel"]
    assert full == 2 * sum(p.numel() for p in make_model().parameters())  # two moments of everything
    parts = [v["state_numel"] for v in result(ranks, f"{sharding}-adamw")]
    assert sum(parts) == full  # every moment kept exactly once
    assert max(parts) <= full / nranks * 1.25, parts  # each rank about 1/N
    many = [v["state_numel"] for v in result(ranks, f"{sharding}-adamw-tiny")]
    assert sum(many) == full and max(many) <= full / nranks * 1.4, many


@pytest.mark.timeout(300)
def test_zero2_keeps_only_its_own_gradients(two):
    for name in ("gradients-sgd", "gradients-adamw-tiny"):
        assert all(v["freed"] for v in result(two, name)), name


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sharding", ["optimizer", "gradients"])
def test_backward_passes_per_step_2(two, sharding):
    got = result(two, f"{sharding}-bpps2")
    assert_identical_on_ranks(got, "bpps2")
    assert_close(got[0]["weights"], reference("adamw")[0], 1e-5, f"{sharding} bpps=2")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sharding", ["optimizer", "gradients"])
def test_clip_grad_norm_is_the_global_norm(two, sharding):
    got = result(two, f"{sharding}-clip")
    unsharded = result(two, "none-clip")[0]
    want, ref_norms = reference("sgd", clip=0.05)
    for v in got:
        assert v["norms"] == pytest.approx(unsharded["norms"], rel=1e-5)
        assert v["norms"] == pytest.approx(ref_norms, rel=1e-5)
    assert min(ref_norms) > 0.05  # the clip did clip
    assert_close(got[0]["weights"], unsharded["weights"], 1e-6, f"{sharding} clipped vs unsharded")
    assert_close(got[0]["weights"], want, 1e-5, f"{sharding} clipped vs one process")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sharding", ["optimizer", "gradients"])
def test_fp16_compression(two, sharding):
    got = result(two, f"{sharding}-fp16")
    assert_identical_on_ranks(got, "fp16")
    assert_close(got[0]["weights"], result(two, "none-fp16")[0]["weights"], 1e-3, f"{sharding} fp16")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("nranks,sharding", [(1, "gradients"), (2, "gradients"), (2, "optimizer")])
def test_checkpoint_saved_at_2_ranks_resumes_at_another_size(two, ckpt, nranks, sharding):
    saved = result(two, "save")
    want, _ = reference("adamw")
    assert_close(saved[0]["weights"], want, 1e-5, "the saving run")
    resumed = [pickle.loads(b) for b in run_ranks(run_resume, nranks, args=(ckpt, sharding), timeout=120)]
    assert_close(resumed[0]["weights"], want, 1e-5, f"resumed at {nranks} ranks ({sharding})")
    assert_close(resumed[0]["weights"], saved[0]["weights"], 1e-5, "resumed vs uninterrupted")


@pytest.mark.timeout(300)
def test_consolidated_state_loads_into_a_plain_optimizer(two, ckpt):
    result(two, "save")
    model = make_model()
    model.load_state_dict(torch.load(os.path.join(ckpt, "model.pt")))
    opt = make_opt("adamw", model.parameters())
    opt.load_state_dict(torch.load(os.path.join(ckpt, "full.pt")))
    got, _ = reference("adamw", steps=2, start=2, model=model, opt=opt)
    assert_close(got, reference("adamw")[0], 1e-5, "consolidated into torch.optim.AdamW")


@pytest.mark.timeout(300)
def test_errors_on_the_ranks(two):
    lbfgs, other = result(two, "errors")[0]
    assert "LBFGS" in lbfgs and "per parameter" in lbfgs
    assert "another model" in other and "enc.0.weight" in other


def test_bad_sharding_is_a_config_error():
    import hora.torch as hvd

    model = make_model()
    with pytest.raises(ConfigError, match="'optimizer', 'gradients'"):
        hvd.DistributedOptimizer(make_opt("sgd", model.parameters()), sharding="zero3")
    with pytest.raises(ConfigError, match="bucket_cap_mb > 0"):
        hvd.DistributedOptimizer(make_opt("sgd", model.parameters()), sharding="optimizer", bucket_cap_mb=0)
    with pytest.raises(ConfigError, match="groups"):
        hvd.DistributedOptimizer(make_opt("sgd", model.parameters()), sharding="gradients", groups=2)


def test_owner_assignment_is_balanced_and_deterministic():
    from hora.torch.sharded_optimizer import assign_owners

    sizes = [[100, 60, 40, 30, 30, 7], [50], [50], [9, 9, 9]]
    a = assign_owners(sizes, 3)
    assert a == assign_owners(sizes, 3)
    assert a[0].width == 100
    loads = [sum(n for n, r in zip(sizes[0], a[0].owners) if r == k) for k in range(3)]
    assert sorted(loads) == [77, 90, 100]
    assert [a[1].owners[0], a[2].owners[0]] == [2, 1]  # lone parameters go to the least loaded rank
    for shard, numels in zip(a, sizes):  # rows: each parameter once, contiguous, within the width
        for r, row in enumerate(shard.rows):
            off = 0
            for i in row:
                assert shard.owners[i] == r and shard.offsets[i] == off
                off += numels[i]
            assert off <= shard.width


def test_owner_totals_are_even_with_lone_parameters_larger_than_a_bucket():
    """An embedding and a vocabulary head past the bucket cap (a bucket each) at both ends, blocks
    in ordinary buckets between: each rank ends up with about half of all the elements (placing
    buckets in order gave one rank a lone tensor plus the heavier row of every block)."""
    from hora.torch.sharded_optimizer import assign_owners

    sizes = [[1], [117], *[[9, 9, 7, 2]] * 12, [117]]
    totals = [0, 0]
    for shard, numels in zip(assign_owners(sizes, 2), sizes):
        for n, r in zip(numels, shard.owners):
            totals[r] += n
        assert shard.width == (16 if len(numels) == 4 else numels[0])  # rows stay even within a bucket
    assert abs(totals[0] - totals[1]) <= 5, totals


def test_large_parameters_get_buckets_of_their_own():
    """A large parameter (1 MiB, or a quarter of the bucket cap) is a bucket alone (broadcast and reduced in
    place: no flat buffer of `size` rows of it); the small ones around it stay together, in order."""
    from hora.torch.sharded_optimizer import split_large

    small = [torch.zeros(4) for _ in range(4)]
    big = [torch.zeros(64), torch.zeros(100)]
    buckets = [[small[0], big[0], small[1]], [small[2], small[3]], [big[1]]]
    got = split_large(buckets, lone_bytes=64 * 4)
    assert [[id(p) for p in b] for b in got] == [[id(small[0])], [id(big[0])], [id(small[1])],
                                                  [id(small[2]), id(small[3])], [id(big[1])]]
    assert split_large(buckets, lone_bytes=1e9) == buckets
