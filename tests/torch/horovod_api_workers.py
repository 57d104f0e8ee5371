"""Functions run on every rank by tests/torch/test_horovod_api.py: the Horovod names and
signatures of hora.torch, their gradients, sparse gradients, Adasum and elastic.run.

Each check appends to a list of failures (an empty list: everything held), so one spawned
job checks many things."""

from __future__ import annotations

import copy
import os
import warnings
from typing import Any

import numpy as np
import torch


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-6) -> bool:
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=tol, atol=tol)


def api_checks(tmp: str) -> list[str]:
    """The collectives with Horovod's signatures, values and gradients."""
    import hora.torch as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    bad: list[str] = []

    def check(what: str, ok: bool) -> None:
        if not ok:
            bad.append(what)

    x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + r
    total = sum(torch.arange(6, dtype=torch.float32).reshape(2, 3) + k for k in range(n))
    # average=, op=None and Horovod's positional order (tensor, average, name, op)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        check("average=False is Sum", _close(hvd.allreduce(x, average=False), total))
        check("average=True is Average", _close(hvd.allreduce(x, average=True), total / n))
    check("average= warns as Horovod", any(issubclass(w.category, DeprecationWarning) and
                                           "replaced with `op`" in str(w.message) for w in ws))
    check("op=None is Average", _close(hvd.allreduce(x, op=None), total / n))
    y = x.clone()
    check("allreduce_ positional", hvd.allreduce_(y, None, "pos.name", hvd.Sum) is y and _close(y, total))
    try:
        hvd.allreduce(x, average=True, op=hvd.Sum)
        check("op and average together refused", False)
    except ValueError:
        pass
    h = hvd.allreduce_async(x, op=hvd.Max, name="async.max")
    check("poll/synchronize", _close(hvd.synchronize(h), x + (n - 1 - r)) and hvd.poll(h))
    # gradients of every differentiable op
    t = x.clone().requires_grad_()
    hvd.allreduce(t, op=hvd.Sum).backward(torch.ones(2, 3))
    check("allreduce grad", _close(t.grad, torch.full((2, 3), float(n))))
    ts = [x.clone().requires_grad_() for _ in range(2)]
    for s in hvd.grouped_allreduce(ts, op=hvd.Average):
        s.sum().backward()
    check("grouped_allreduce grad", all(_close(q.grad, torch.ones(2, 3)) for q in ts))
    rows = r + 1  # dim 0 differs by rank
    g_in = torch.full((rows, 2), float(r), requires_grad=True)
    gathered = hvd.allgather(g_in)
    want_rows = sum(k + 1 for k in range(n))
    check("allgather values", gathered.shape == (want_rows, 2) and
          torch.equal(gathered[:, 0], torch.cat([torch.full((k + 1,), float(k)) for k in range(n)])))
    weights = torch.cat([torch.full((k + 1, 2), float(k + 1)) for k in range(n)])
    (gathered * weights).sum().backward()
    check("allgather grad", _close(g_in.grad, torch.full((rows, 2), float(r + 1))))
    ga = [torch.full((rows, 2), float(r), requires_grad=True) for _ in range(2)]
    outs = hvd.grouped_allgather(ga)
    for o in outs:
        (o * weights).sum().backward()
    check("grouped_allgather grad", all(_close(q.grad, torch.full((rows, 2), float(r + 1))) for q in ga))
    b_in = torch.full((3,), float(r), requires_grad=True)
    b = hvd.broadcast(b_in, root_rank=n - 1)
    check("broadcast value", torch.equal(b.detach(), torch.full((3,), float(n - 1))))
    b.sum().backward()
    check("broadcast grad", _close(b_in.grad, torch.full((3,), 1.0 if r == n - 1 else 0.0)))
    send = torch.cat([torch.full((k + 1, 2), float(r * 10 + k)) for k in range(n)]).requires_grad_()
    out, recv = hvd.alltoall(send, splits=torch.tensor([k + 1 for k in range(n)], dtype=torch.int32))
    check("alltoall with splits", recv.dtype == torch.int32 and recv.tolist() == [r + 1] * n and
          torch.equal(out.detach()[:, 0], torch.cat([torch.full((r + 1,), float(k * 10 + r)) for k in range(n)])))
    (out * 2).sum().backward()
    check("alltoall grad", _close(send.grad, torch.full(send.shape, 2.0)))
    eq = hvd.alltoall(torch.arange(2 * n, dtype=torch.float32))
    check("alltoall without splits returns the tensor", isinstance(eq, torch.Tensor) and eq.shape == (2 * n,))
    rs_in = (torch.arange(4 * n, dtype=torch.float32) + r).reshape(2 * n, 2).requires_grad_()
    rs = hvd.reducescatter(rs_in, op=hvd.Sum)
    full = sum((torch.arange(4 * n, dtype=torch.float32) + k).reshape(2 * n, 2) for k in range(n))
    check("reducescatter value", _close(rs.detach(), full[2 * r : 2 * r + 2]))
    rs.sum().backward()
    check("reducescatter grad", _close(rs_in.grad, torch.full((2 * n, 2), float(n))))
    scaled = hvd.reducescatter(rs_in.detach(), op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    check("reducescatter pre/postscale", _close(scaled, full[2 * r : 2 * r + 2] * 1.5))
    grs = [rs_in.detach().clone().requires_grad_() for _ in range(2)]
    for o in hvd.grouped_reducescatter(grs, op=hvd.Average):
        o.sum().backward()
    check("grouped_reducescatter grad", all(_close(q.grad, torch.ones(2 * n, 2)) for q in grs))
    gh = hvd.grouped_reducescatter_async([rs_in.detach()], op=hvd.Sum)
    check("grouped_reducescatter_async", _close(hvd.synchronize(gh)[0], full[2 * r : 2 * r + 2]))
    gah = hvd.grouped_allgather_async([torch.tensor([r])])
    check("grouped_allgather_async", hvd.synchronize(gah)[0].tolist() == list(range(n)))
    # sparse allreduce equals the dense one
    torch.manual_seed(r)
    dense = torch.rand(7, 4) * (torch.rand(7, 4) > 0.6)
    handle = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse", op=hvd.Average)
    check("sparse_allreduce_async", _close(handle().to_dense(), hvd.allreduce(dense, name="dense")))
    # process sets: the same name in two sets is two ops (as Horovod)
    sets = [hvd.add_process_set([k]) for k in range(n)]
    mine = hvd.broadcast_object({"rank": r}, root_rank=r, name="same.name", process_set=sets[r])
    check("names are per process set", mine == {"rank": r})
    for ps in sets:
        hvd.remove_process_set(ps)
    # join with Horovod's device argument: the last rank to join, the same everywhere
    if r == 0:
        last = hvd.join(-1)
    else:
        hvd.allreduce(torch.ones(1), name="before.join")
        last = hvd.join(0)
    check("join returns the last rank", hvd.allgather_object(last) == [last] * n and last != 0)
    # the timeline at run time
    path = os.path.join(tmp, "timeline.json")
    hvd.start_timeline(path, mark_cycles=True)
    hvd.allreduce(torch.ones(2), name="in.the.timeline")
    hvd.stop_timeline()
    if r == 0:
        text = open(path).read()
        check("timeline", "in.the.timeline" in text and "CYCLE_START" in text)
    check("build info", hvd.gloo_built() and hvd.gloo_enabled() and not hvd.mpi_enabled()
          and hvd.nccl_built() == (0 if not torch.cuda.is_available() else hvd.nccl_built()))
    hvd.shutdown()
    return bad


# ------------------------------------------------------------------------------ optimizer
class _Bag(torch.nn.Module):
    def __init__(self, sparse: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(12, 3, sparse=sparse)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.emb(idx).sum()


def _inputs(rank: int) -> torch.Tensor:
    return torch.tensor([[rank, rank + 1, 7], [rank + 3, 7, 11]])


def optimizer_checks() -> list[str]:
    """Sparse gradients (both ways), groups, _parameter_names, Horovod's warning, Adasum."""
    import hora.torch as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    bad: list[str] = []
    # the reference: one process, the average of every rank's sparse gradient
    ref = _Bag(sparse=True)
    for k in range(n):
        (ref(_inputs(k)) / n).backward()
    ref_opt = torch.optim.SparseAdam(list(ref.parameters()), lr=0.1)
    ref_opt.step()
    for as_dense in (False, True):
        model = _Bag(sparse=True)
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
                                       sparse_as_dense=as_dense)
        model(_inputs(r)).backward()
        opt.step()
        if not torch.allclose(model.emb.weight, ref.emb.weight, atol=1e-6):
            bad.append(f"sparse_as_dense={as_dense}: weights differ from the averaged reference")
        if not model.emb.weight.grad.is_sparse:
            bad.append(f"sparse_as_dense={as_dense}: the reduced gradient is not sparse")
    # explicit groups and Horovod's attributes and warning
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                   groups=[[net[0].weight, net[1].weight]])
    if sorted(len(b) for b in opt._hora_buckets) != [1, 1, 2]:
        bad.append(f"groups: buckets {[len(b) for b in opt._hora_buckets]}")
    if set(opt._parameter_names) != set(net.parameters()) or len(set(opt._parameter_names.values())) != 4:
        bad.append("_parameter_names")
    torch.manual_seed(10 + r)
    net(torch.randn(5, 4)).sum().backward()
    opt.synchronize()
    grads = [p.grad.clone() for p in net.parameters()]
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        opt.step()
    if len(ws) != 1 or "optimizer.step() called without optimizer.skip_synchronize()" not in str(ws[0].message):
        bad.append(f"synchronize-then-step warning: {[str(w.message) for w in ws]}")
    for g in grads:
        if not torch.allclose(hvd.allreduce(g, op=hvd.Min), hvd.allreduce(g, op=hvd.Max)):
            bad.append("groups: gradients differ across ranks")
    # Adasum: each rank steps on its own gradient; the updates are combined with Adasum
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2, bias=False)
    start = lin.weight.detach().clone()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.5), op=hvd.Adasum)
    data = [torch.randn(4, 3, generator=torch.Generator().manual_seed(100 + k)) for k in range(n)]
    lin(data[r]).pow(2).sum().backward()
    opt.step()
    deltas = []
    for k in range(n):
        w = start.clone().requires_grad_()
        (data[k] @ w.t()).pow(2).sum().backward()
        deltas.append((-0.5 * w.grad).numpy().astype(np.float64).ravel())
    want = start.numpy().ravel() + numpy_adasum(deltas)
    if not np.allclose(lin.weight.detach().numpy().ravel(), want, atol=1e-5):
        bad.append(f"Adasum optimizer: {lin.weight.detach().numpy().ravel()} != {want}")
    hvd.shutdown()
    return bad


def numpy_adasum(vectors: list[np.ndarray]) -> np.ndarray:
    """Adasum of one vector per rank along the binary tree, in numpy (the test's own)."""
    def pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
        ca = 1.0 - dot / (2 * aa) if aa > 1e-150 else 1.0
        cb = 1.0 - dot / (2 * bb) if bb > 1e-150 else 1.0
        return ca * a + cb * b

    vs = [v.astype(np.float64) for v in vectors]
    p = 1
    while p * 2 <= len(vs):
        p *= 2
    for extra in range(p, len(vs)):
        vs[extra - p] = pair(vs[extra - p], vs[extra])
    vs = vs[:p]
    while len(vs) > 1:
        vs = [pair(vs[i], vs[i + 1]) for i in range(0, len(vs), 2)]
    return vs[0]


def adasum_values() -> list[str]:
    """hora's Adasum against numpy, fused tensors of odd sizes, on sets of 2, 3 and 4 ranks."""
    import hora.native as hn

    hn.init()
    r, n = hn.rank(), hn.size()
    bad: list[str] = []
    sizes = [1, 7, 64, 130]

    def data(rank: int, i: int, dtype: torch.dtype) -> torch.Tensor:
        g = torch.Generator().manual_seed(1000 * rank + i)
        t = torch.randn(sizes[i], generator=g, dtype=torch.float64)
        if i == 2 and rank % 2:
            t.zero_()  # a zero vector keeps the other one
        if i == 3 and rank == 1:
            t = data(0, 3, torch.float64) * 2.0  # parallel to rank 0's: averaged, not summed
        return t.to(dtype)

    for ranks in sorted({tuple(range(n)), tuple(range(min(n, 3))), (0, 1)}):
        ps = hn.add_process_set(list(ranks)) if len(ranks) < n else hn.global_process_set
        if r in ranks:
            for dtype, tol in ((torch.float64, 1e-9), (torch.float32, 1e-5)):
                handles = [hn.allreduce_async(data(r, i, dtype), op=hn.Adasum, name=f"ada.{ranks}.{dtype}.{i}",
                                              process_set=ps) for i in range(len(sizes))]
                for i, h in enumerate(handles):
                    got = h.synchronize().double().numpy()
                    want = numpy_adasum([data(k, i, torch.float64).numpy() for k in ranks])
                    if not np.allclose(got, want, rtol=tol, atol=tol):
                        bad.append(f"ranks {ranks} {dtype} tensor {i}: {got[:4]} != {want[:4]}")
        if ps is not hn.global_process_set:
            hn.remove_process_set(ps)
    hn.shutdown()
    return bad


# ------------------------------------------------------------------------------ elastic
STEPS = 8


def _step_data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)


def _fresh_model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Linear(4, 1)


def elastic_run(fail_ranks: list[int], fail_step: int) -> dict[str, Any]:
    """Train STEPS steps in ``hvd.elastic.run``; ``fail_ranks`` raise HorovodInternalError
    once at ``fail_step`` (the others then see their collectives fail). The result must
    equal a run without failures."""
    import hora.torch as hvd
    from hora.errors import HorovodInternalError

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    model = _fresh_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0, trace=[])
    resets: list[int] = []
    state.register_reset_callbacks([lambda: resets.append(state.step)])
    failed = {"done": False}

    @hvd.elastic.run
    def train(state: Any) -> int:
        while state.step < STEPS:
            if state.step == fail_step and r in fail_ranks and not failed["done"]:
                failed["done"] = True
                raise HorovodInternalError(f"injected on rank {r} at step {state.step}")
            x, y = _step_data(state.step)
            half = x.shape[0] // n
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[r * half:(r + 1) * half]), y[r * half:(r + 1) * half]).backward()
            opt.step()
            state.step += 1
            state.trace.append(state.step)
            if state.step % 3 == 0:
                state.commit()
        return state.step

    steps = train(state)
    # the same training without failures, in one process on the whole batch
    ref = _fresh_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        x, y = _step_data(step)
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    close = all(torch.allclose(a, b, atol=1e-5) for a, b in zip(model.state_dict().values(),
                                                                 ref.state_dict().values()))
    weights = copy.deepcopy(model.state_dict())
    hvd.shutdown()
    return {"steps": steps, "resets": resets, "trace": list(state.trace), "close": close, "weights": weights}


def elastic_runs(scenarios: list[list[int]], fail_step: int) -> list[dict[str, Any]]:
    """:func:`elastic_run` once per failing-ranks list, one after the other."""
    return [elastic_run(fail_ranks, fail_step) for fail_ranks in scenarios]
