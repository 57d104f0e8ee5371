"""Execution: running agreed responses on the backend, one executor per op kind.

Allreduces run as fused groups (:mod:`.fusion`) through :meth:`Executor.run_allreduce`
(or, in the steady state, a cached plan: :meth:`Executor.run_planned`); every other
kind runs alone through its entry in :data:`EXECUTORS`. A backend failure of one op
fails that op's request only; a :class:`~hora.errors.CollectiveError` raised by the
backend (a lost peer) stops the engine.

A lone out-of-place allreduce is reduced straight into its result
(:meth:`Backend.allreduce_into`: through shared memory the input goes into the segment
and the sum comes out into the result, the average's scaling folded into the reduction),
with the result from the :class:`~.fusion.OutputPool`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from hora.errors import CollectiveError
from hora.native import adasum
from hora.native.backends.base import Backend, Group, ReduceOp
from hora.native.compression import NoneCompressor
from hora.native.engine import fusion
from hora.native.engine.cache import Response
from hora.native.engine.fusion import FusedGroup, Single, flat, pack, unpack
from hora.native.engine.request import (
    ALLGATHER, ALLTOALL, BARRIER, BROADCAST, JOIN, PS_ADD, PS_REMOVE, REDUCESCATTER, Request,
)

if TYPE_CHECKING:
    from hora.native.engine.negotiation import ProcessSetInfo
    from hora.native.engine.state import EngineState


def scale_(buf: torch.Tensor, factor: float) -> None:
    """Multiply in place; integer tensors are scaled in float64 and rounded toward zero
    (as Horovod, and as a cast of the float64 product would)."""
    if buf.is_floating_point():
        buf.mul_(factor)
    else:
        buf.copy_(torch.trunc(buf.to(torch.float64) * factor).to(buf.dtype))


def reduce_buffer(buf: torch.Tensor, op: ReduceOp, pre: float, post: float, compressor: Any, group: Group,
                  be: Backend, segments: Sequence[int] | None = None, src: torch.Tensor | None = None) -> None:
    """Reduce ``src`` (default: ``buf`` itself) into ``buf`` over ``group``: prescale,
    compress, reduce, average, postscale.

    ``segments``: the element counts of the tensors fused in ``buf`` (Adasum gives each
    its own coefficients; the other ops need not know). A plain floating-point reduction
    (no prescale, no compression) goes through :meth:`Backend.allreduce_into`, which
    reduces ``src`` straight into ``buf`` and folds the scaling in. Which path runs
    depends on the agreed key only (never on in place or not: every member of the group
    must take the same one, as the shared-memory path scales each chunk on one member)."""
    wire_op = ReduceOp.Sum if op == ReduceOp.Average else op
    if (pre == 1.0 and compressor is NoneCompressor and op != ReduceOp.Adasum and buf.is_floating_point()
            and be.supports_reduce(buf.dtype, wire_op)):
        scale = post / group.size if op == ReduceOp.Average else post
        be.allreduce_into(buf, buf if src is None else src, wire_op, group, scale)
        return
    if src is not None and src is not buf:
        buf.copy_(src)
    if pre != 1.0:
        scale_(buf, pre)
    wire, ctx = compressor.compress(buf) if buf.is_floating_point() else (buf, None)
    if op == ReduceOp.Adasum:
        adasum.allreduce(wire, segments or [wire.numel()], be, group)
    elif not be.supports_reduce(wire.dtype, wire_op):
        up = wire.to(torch.float64 if wire.dtype in (torch.int32, torch.int64, torch.float64) else torch.float32)
        be.allreduce(up, wire_op, group)
        wire.copy_(up)
    else:
        be.allreduce(wire, wire_op, group)
    if wire is not buf:
        buf.copy_(compressor.decompress(wire, ctx))
    if op == ReduceOp.Average:
        if buf.is_floating_point() or post != 1.0:
            post = post / group.size  # (integers: one truncation, after the postscale)
        else:
            buf.div_(group.size, rounding_mode="trunc")
    if post != 1.0:
        scale_(buf, post)


# -- one executor per kind (allreduce runs through the fused path) --------------------------
def _barrier(be: Backend, group: Group, resp: Response, req: Request | None) -> Any:
    # Nothing to run: a response is ready only once every member has submitted the op (its
    # bit is set on every rank, or every member reported it by name), and every rank learns
    # that from the round's own collective, so each member has entered the barrier by now.
    # (A backend barrier on top cost a Gloo store round trip, 2-5 ms.)
    return None


def _join(be: Backend, group: Group, resp: Response, req: Request | None) -> Any:
    return resp.extra_result  # the last rank to join, the same on every rank


def _broadcast(be: Backend, group: Group, resp: Response, req: Request) -> Any:
    be.broadcast(req.output, group.ranks.index(req.root), group)
    return req.output


def _allgather(be: Backend, group: Group, resp: Response, req: Request) -> Any:
    rows = [resp.locals[r][0] for r in group.ranks]
    rest = tuple(req.tensor.shape[1:])
    inp = req.tensor
    if len(set(rows)) == 1:
        out = torch.empty((sum(rows),) + rest, dtype=inp.dtype, device=inp.device)
        be.allgather(out, inp, group)
        return out
    mx = max(rows)
    padded = torch.zeros((mx,) + rest, dtype=inp.dtype, device=inp.device)
    padded[: inp.shape[0]] = inp
    tmp = torch.empty((mx * group.size,) + rest, dtype=inp.dtype, device=inp.device)
    be.allgather(tmp, padded, group)
    return torch.cat([tmp[i * mx : i * mx + n] for i, n in enumerate(rows)])


def _alltoall(be: Backend, group: Group, resp: Response, req: Request) -> Any:
    me = group.rank
    send = list(req.splits)
    recv = [resp.locals[r][1][me] for r in group.ranks]
    rest = tuple(req.tensor.shape[1:])
    out = torch.empty((sum(recv),) + rest, dtype=req.tensor.dtype, device=req.tensor.device)
    be.alltoall(out, req.tensor, recv, send, group)
    return out, torch.tensor(recv, dtype=torch.int32)


def _reducescatter(be: Backend, group: Group, resp: Response, req: Request) -> Any:
    t = req.tensor
    n = group.size
    rows = t.shape[0] if t.dim() else 1
    counts = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
    op = ReduceOp(resp.key.op)
    pre, post = resp.key.prescale_factor, resp.key.postscale_factor
    wire_op = ReduceOp.Sum if op == ReduceOp.Average else op
    if rows % n == 0 and be.supports_reduce(t.dtype, wire_op):
        inp = t
        if pre != 1.0:
            inp = t.clone()
            scale_(inp, pre)
        out = torch.empty((counts[group.rank],) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
        be.reducescatter(out, inp, wire_op, group)
        if op == ReduceOp.Average and (out.is_floating_point() or post != 1.0):
            post = post / n
        elif op == ReduceOp.Average:
            out.div_(n, rounding_mode="trunc")
        if post != 1.0:
            scale_(out, post)
        return out
    tmp = t.clone()
    reduce_buffer(tmp.view(-1), op, pre, post, NoneCompressor, group, be)
    start = sum(counts[: group.rank])
    return tmp[start : start + counts[group.rank]].clone()


Executor_ = Callable[[Backend, Group, Response, Any], Any]
#: the executor of each kind that runs alone; (request None: this rank joined, only
#: barrier and join go on without one)
EXECUTORS: dict[str, Executor_] = {
    BARRIER: _barrier, JOIN: _join, BROADCAST: _broadcast, ALLGATHER: _allgather, ALLTOALL: _alltoall,
    REDUCESCATTER: _reducescatter,
}
_NEEDS_NO_REQUEST = frozenset({BARRIER, JOIN})


class Executor:
    """Runs a round's responses on this rank (the engine thread only)."""

    def __init__(self, state: EngineState) -> None:
        self.state = state
        self.buffers = fusion.FusionBuffers()
        self._plans: dict[bytes, tuple[tuple, list[Any]]] = {}

    def release(self) -> None:
        self.buffers.clear()
        self._plans.clear()

    def buffer(self, dtype: torch.dtype, numel: int, device: torch.device) -> torch.Tensor:
        return self.buffers.get(dtype, numel, device, self.state.tuning.fusion_threshold)

    def plan(self, responses: Sequence[Response]) -> list[Any]:
        eng = self.state
        return fusion.plan(responses, eng.process_sets, eng.tuning.fusion_threshold)

    # -- a round's responses ---------------------------------------------------------------
    def execute(self, responses: list[Response]) -> None:
        """Run ``responses`` (a normal round): group, then run unit by unit."""
        eng = self.state
        pop = eng.waiting.pop
        tl = eng.timeline
        for unit in self.plan(responses):
            if type(unit) is FusedGroup:
                reqs = [pop(r.name, None) for r in unit.resps]
                if tl.enabled:
                    now = tl.now()
                    for r, q in zip(unit.resps, reqs):
                        if q is not None:
                            q.t_ready = now
                            tl.span(r.name, "NEGOTIATE", q.t_submit, now)
                self.run_allreduce(unit.resps, reqs, unit.ps)
            else:
                req = pop(unit.resp.name, None)
                if tl.enabled and req is not None:
                    req.t_ready = tl.now()
                    tl.span(unit.resp.name, "NEGOTIATE", req.t_submit, req.t_ready)
                self.run_single(unit.resp, req, unit.ps)

    def run_planned(self, bits: bytes, responses: list[Response]) -> None:
        """The steady state: only cached responses; reuse the plan of the last round
        with exactly these ``bits``."""
        eng = self.state
        version = (eng.cache.version, eng.ps_version, eng.tuning.fusion_threshold)
        cached = self._plans.get(bits)
        if cached is None or cached[0] != version:
            if len(self._plans) > 64:
                self._plans.clear()
            cached = self._plans[bits] = (version, self.plan(responses))
        pop = eng.waiting.pop
        for unit in cached[1]:
            if type(unit) is not FusedGroup:
                self.run_single(unit.resp, pop(unit.resp.name, None), unit.ps)
                continue
            reqs = [pop(n, None) for n in unit.names]
            if len(reqs) == 1 or None in reqs or unit.resps[0].key.device != "cpu":
                self.run_allreduce(unit.resps, reqs, unit.ps)
                continue
            key = unit.resps[0].key
            q0 = reqs[0]
            buf = self.buffer(q0.tensor.dtype, unit.nbytes // q0.tensor.element_size(), q0.tensor.device)
            parts, shaped = fusion.views(buf, unit)
            pack(parts, reqs, shaped)
            try:
                reduce_buffer(buf, ReduceOp(key.op), key.prescale_factor, key.postscale_factor, q0.compressor,
                              unit.ps.group, eng.backend, unit.sizes)
            except CollectiveError:
                raise
            except Exception as exc:
                err = CollectiveError(f"allreduce of {unit.names[:5]}... failed: {exc}")
                for q in reqs:
                    eng.finish(q, error=err)
                continue
            unpack(parts, reqs, shaped=shaped)
            eng.finish_fused(reqs, unit.nbytes)

    def run_allreduce(self, resps: list[Response], reqs: list[Request | None], ps: ProcessSetInfo) -> None:
        """One fused group (or one tensor): copy in, reduce, copy out, complete."""
        eng = self.state
        tl = eng.timeline
        key = resps[0].key
        dtype = getattr(torch, key.dtype)
        op = ReduceOp(key.op)
        pre, post = key.prescale_factor, key.postscale_factor
        compressor = next((q.compressor for q in reqs if q is not None), None)
        if compressor is None:
            from hora.native.compression import resolve

            compressor = resolve(key.compression) if key.compression in ("none", "fp16", "bf16") else NoneCompressor
        dev_type = key.device or "cpu"
        device = next((q.tensor.device for q in reqs if q is not None), None)
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if dev_type == "cuda" else torch.device("cpu")
        if dev_type != "cpu":
            for q in reqs:
                if q is not None and q.ready_event is not None:
                    q.ready_event.synchronize()
        t_start = tl.now() if tl.enabled else 0.0
        if tl.enabled:
            for resp, q in zip(resps, reqs):
                if q is not None:
                    tl.span(resp.name, "QUEUE", q.t_ready, t_start)
        src = None
        parts: list[torch.Tensor] = []
        if len(resps) == 1:
            q = reqs[0]
            if q is None:
                buf = torch.zeros(resps[0].numel, dtype=dtype, device=device)
            else:
                if q.output is None:  # out of place: the engine makes the result
                    q.output = (fusion.OUTPUTS.empty(q.tensor.shape, q.tensor.dtype) if device.type == "cpu"
                                else torch.empty_like(q.tensor))
                buf = flat(q.output)
                if q.output is not q.tensor:
                    src = flat(q.tensor)
            fused = False
        else:
            buf = self.buffer(dtype, sum(r.numel for r in resps), device)
            parts = list(buf.split([r.numel for r in resps]))
            pack(parts, reqs)
            fused = True
            eng.stats["fused_batches"] += 1
            eng.stats["fused_tensors"] += len(resps)
            if tl.enabled:
                t1 = tl.now()
                for resp in resps:
                    tl.span(resp.name, "FUSE_COPY_IN", t_start, t1)
                t_start = t1
        try:
            reduce_buffer(buf, op, pre, post, compressor, eng.group_for(ps, dev_type), eng.backend_for(dev_type),
                          [r.numel for r in resps], src=src)
        except CollectiveError:
            raise
        except Exception as exc:
            err = CollectiveError(f"allreduce of {[r.name for r in resps]} failed: {exc}")
            for q in reqs:
                if q is not None:
                    eng.finish(q, error=err)
            return
        if tl.enabled:
            t1 = tl.now()
            for resp in resps:
                tl.span(resp.name, "COLLECTIVE", t_start, t1, bytes=resp.nbytes, fused=len(resps))
            t_start = t1
        st = eng.stats
        st["allreduce_tensors"] += len(resps)
        st["allreduce_calls"] += 1
        st["allreduce_bytes"] += buf.numel() * buf.element_size()
        if fused:
            unpack(parts, reqs)
            if tl.enabled:
                t1 = tl.now()
                for resp in resps:
                    tl.span(resp.name, "FUSE_COPY_OUT", t_start, t1)
        completed = eng.completed
        for q in reqs:
            if q is not None:
                q._result = q.output
                completed.append(q)

    def run_single(self, resp: Response, req: Request | None, ps: ProcessSetInfo) -> None:
        """Run one unfused response and complete its request (a backend failure fails
        only that request)."""
        eng = self.state
        tl = eng.timeline
        kind = resp.kind
        t0 = tl.now() if tl.enabled else 0.0
        if tl.enabled and req is not None:
            tl.span(resp.name, "QUEUE", req.t_ready, t0)
        try:
            if kind in (PS_ADD, PS_REMOVE):
                result = eng.apply_process_set_op(resp)
            else:
                dev_type = (resp.key.device if resp.key else "") or "cpu"
                be, group = eng.backend, ps.group
                if dev_type != "cpu":
                    be = eng.backend_for(dev_type)
                    group = eng.group_for(ps, dev_type)
                if req is not None and req.ready_event is not None:
                    req.ready_event.synchronize()
                if req is None and kind not in _NEEDS_NO_REQUEST:
                    raise CollectiveError(f"rank {eng.rank} has joined and cannot take part in {kind} "
                                          f"'{resp.name}'")
                run = EXECUTORS.get(kind)
                if run is None:
                    raise CollectiveError(f"unknown collective kind {kind!r}")
                result = run(be, group, resp, req)
        except CollectiveError:
            raise
        except Exception as exc:
            if req is not None:
                eng.finish(req, error=CollectiveError(f"{resp.kind} '{resp.name}' failed: {exc}"))
            return
        if tl.enabled:
            tl.span(resp.name, "COLLECTIVE", t0, tl.now(), kind=kind)
        eng.stats[f"{kind}_calls"] += 1
        if req is not None:
            eng.finish(req, result=result)


__all__ = ["EXECUTORS", "Executor", "reduce_buffer", "scale_", "Single"]
