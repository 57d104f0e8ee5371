"""The engine's parts on their own, in this process: the control vector's two encodings,
the executor of every op kind, fusion's grouping and copies, the output pool, stall
inspection, negotiation's mismatch message and the autotuner's proposals."""

from __future__ import annotations

import collections
import gc
import logging

import numpy as np
import pytest
import torch
import torch.distributed as dist

from hora.errors import ConfigError
from hora.native.backends.base import ReduceOp
from hora.native.backends.gloo import GlooBackend
from hora.native.engine import autotune, fusion
from hora.native.engine.cache import Response, ResponseCache
from hora.native.engine.config import EngineConfig
from hora.native.engine.control import FLAGS, I32_MAX, ControlVector, Vote
from hora.native.engine.execute import EXECUTORS
from hora.native.engine.negotiation import Negotiator, Pending, ProcessSetInfo
from hora.native.engine.request import (
    ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, JOIN, PS_ADD, PS_REMOVE, REDUCESCATTER, OpKind, Request,
    fast_allreduce_request,
)
from hora.native.engine.stalls import StallInspector


# ---------------------------------------------------------------------------- control vector
def _votes(rng: np.random.Generator, C: int, size: int) -> list[dict]:
    """Random per-rank inputs of a round (a rank outside a set votes ready, not have)."""
    nonmember = sorted(rng.choice(C, size=2, replace=False).tolist())
    out = []
    for r in range(size):
        bits = sorted(set(rng.choice(C, size=rng.integers(0, C), replace=True).tolist()) - set(nonmember))
        out.append(dict(bits=bits, nonmember=nonmember if r == size - 1 else [],
                        uncached=bool(rng.integers(0, 2)), payload=int(rng.integers(0, 5000)),
                        has_work=bool(rng.integers(0, 2)), now_ms=int(rng.integers(0, 10**7)),
                        tune=int(rng.integers(0, 16)) if r == 0 else I32_MAX, done=bool(rng.integers(0, 2)),
                        speculate=bool(rng.integers(0, 2))))
    return out


@pytest.mark.timeout(30)
@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_the_tail_form_decodes_to_what_the_min_reduction_gives_for_every_slot(size):
    rng = np.random.default_rng(size)
    C = 12
    cv = ControlVector(C)
    assert cv.size == 2 * C + len(FLAGS) and cv.max_tail() == 2 * C + 8
    for trial in range(25):
        votes = _votes(rng, C, size)
        if trial % 5 == 0:  # every flag at both extremes, not only at random
            for v in votes:
                v.update(uncached=trial % 2 == 0, has_work=trial % 2 == 0, done=trial % 2 == 1,
                         speculate=trial % 2 == 1)
        ctrls = [cv.encode(**v) for v in votes]
        want = np.minimum.reduce(ctrls)  # what a normal round's MIN allreduce gives
        used = C  # every slot travels
        tails = [cv.encode_tail(c, used, np.float64, rank=r, size=size, have=False, alone=False, inplace=False)
                 for r, c in enumerate(ctrls)]
        got = ctrls[0].copy()
        cv.decode_tail(np.sum(tails, axis=0), got, used, size)
        np.testing.assert_array_equal(cv.ready(got), cv.ready(want))
        np.testing.assert_array_equal(cv.partial_slots(got), cv.partial_slots(want))
        fw, fg = cv.flags(want), cv.flags(got)
        assert (fg.any_uncached, fg.any_work, fg.all_done, fg.speculate) == \
               (fw.any_uncached, fw.any_work, fw.all_done, fw.speculate), (fw, fg)
        assert fg.max_payload >= fw.max_payload and fg.max_payload % 1024 == 0  # an upper bound, whole KiB
        assert fg.now_ms == votes[0]["now_ms"] and fw.now_ms == max(v["now_ms"] for v in votes)  # alike on all
        assert fg.tune == I32_MAX and fw.tune == votes[0]["tune"]  # the autotuner waits for a normal round


@pytest.mark.timeout(30)
@pytest.mark.parametrize("size,C", [(1, 12), (2, 12), (3, 12), (2, 100)])  # 100: past the list path's 64 slots
def test_the_tail_written_from_a_vote_is_the_tail_of_its_min_form(size, C):
    # a predicted round writes its tail straight from the vote (no MIN form): the two
    # encodings must agree on every slot and flag, in place and not, held or not
    rng = np.random.default_rng(7 + size)
    cv = ControlVector(C)
    for trial in range(20):
        for r, v in enumerate(_votes(rng, C, size)):
            used = int(rng.integers(0, C + 1))
            v["nonmember"] = sorted(set(rng.integers(0, C, 2).tolist()) - set(v["bits"]))
            have, alone, inplace = (bool(rng.integers(0, 2)) for _ in range(3))
            dtype = np.float32 if trial % 2 else np.float64
            want = cv.encode_tail(cv.encode(**v), used, dtype, rank=r, size=size, have=have, alone=alone,
                                  inplace=inplace)
            got = np.full(cv.tail_size(used, size, inplace), 7, dtype=dtype)  # (stale values are overwritten)
            cv.tail_of(Vote(**v), used, got, rank=r, size=size, have=have, alone=alone, inplace=inplace)
            np.testing.assert_array_equal(got, want)


@pytest.mark.timeout(30)
def test_the_tail_carries_only_the_slots_in_use_and_says_who_held_the_prediction():
    cv = ControlVector(64)
    size = 3
    ctrls = [cv.encode([0, 2], [], False, 0, True, 5, I32_MAX, False, True) for _ in range(size)]
    tails = [cv.encode_tail(c, 3, np.float32, rank=r, size=size, have=r != 1, alone=r != 1, inplace=True)
             for r, c in enumerate(ctrls)]
    assert tails[0].size == 2 * 3 + 8 + size
    out = np.sum(tails, axis=0)
    assert not cv.tail_held(out, 3, size) and not cv.tail_pure(out, 3, size)
    assert cv.tail_holders(out, 3, size).tolist() == [0, 2]
    got = ctrls[0].copy()
    cv.decode_tail(out, got, 3, size)
    assert cv.ready_slots(got) == [0, 2]  # slots beyond the third did not travel: nobody has them


# ---------------------------------------------------------------------------- executors
@pytest.fixture
def one_rank():
    store = dist.HashStore()
    be = GlooBackend(0, 1, store=store, wait_store=store, hostname="127.0.0.1", timeout=30)
    yield be
    be.shutdown()


def _resp(req: Request, extra_result=None) -> Response:
    return Response(req.name, req.key, {0: req.local}, extra_result=extra_result)


@pytest.mark.timeout(60)
def test_every_kind_has_one_executor_and_each_runs(one_rank):
    assert set(EXECUTORS) | {ALLREDUCE, PS_ADD, PS_REMOVE} == set(OpKind) - {OpKind.QUIT}
    be, g = one_rank, one_rank.world
    t = torch.arange(6.0).reshape(3, 2)
    out = t.clone()
    req = Request(BROADCAST, "b", 0, tensor=t, output=out, root=0)
    assert EXECUTORS[BROADCAST](be, g, _resp(req), req) is out and torch.equal(out, t)
    req = Request(ALLGATHER, "g", 0, tensor=t)
    assert torch.equal(EXECUTORS[ALLGATHER](be, g, _resp(req), req), t)
    req = Request(ALLTOALL, "a", 0, tensor=t, splits=(3,))
    got, recv = EXECUTORS[ALLTOALL](be, g, _resp(req), req)
    assert torch.equal(got, t) and recv.tolist() == [3]
    req = Request(REDUCESCATTER, "r", 0, tensor=t, op=ReduceOp.Average, postscale=2.0)
    assert torch.equal(EXECUTORS[REDUCESCATTER](be, g, _resp(req), req), t * 2)
    req = Request(REDUCESCATTER, "ri", 0, tensor=torch.tensor([7, -7]), op=ReduceOp.Sum, prescale=0.5)
    assert EXECUTORS[REDUCESCATTER](be, g, _resp(req), req).tolist() == [3, -3]  # rounded toward zero
    req = Request(BARRIER, "x", 0)
    assert EXECUTORS[BARRIER](be, g, _resp(req), req) is None
    req = Request(JOIN, "j", 0)
    assert EXECUTORS[JOIN](be, g, _resp(req, extra_result=0), req) == 0


# ---------------------------------------------------------------------------- fusion
def _ps() -> ProcessSetInfo:
    class _G:
        is_member = True
    return ProcessSetInfo(0, [0], _G())  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_plan_fuses_by_key_up_to_the_threshold():
    reqs = [fast_allreduce_request(f"t{i}", torch.ones(256), None, ReduceOp.Sum, 1.0, 1.0) for i in range(5)]
    reqs.append(fast_allreduce_request("d", torch.ones(4, dtype=torch.float64), None, ReduceOp.Sum, 1.0, 1.0))
    other = Request(BROADCAST, "b", 0, tensor=torch.ones(2), output=torch.ones(2))
    resps = [_resp(r) for r in reqs[:3]] + [_resp(other)] + [_resp(r) for r in reqs[3:]]
    units = fusion.plan(resps, {0: _ps()}, threshold=3 * 1024)  # three 1 KiB tensors per group
    kinds = [("fused", u.names) if type(u) is fusion.FusedGroup else ("single", u.resp.name) for u in units]
    assert kinds == [("fused", ["t0", "t1", "t2"]), ("single", "b"), ("fused", ["t3", "t4"]), ("fused", ["d"])]
    assert all(u.sizes == [256] * len(u.names) for u in units[:1])
    assert fusion.plan(resps, {}, threshold=1 << 20) == []  # not a member of the set: nothing to run


@pytest.mark.timeout(30)
def test_pack_and_unpack_copy_in_place_and_make_new_tensors_in_one_call():
    a, b = torch.arange(4.0).reshape(2, 2), torch.arange(3.0)
    in_place = fast_allreduce_request("a", a, a, ReduceOp.Sum, 1.0, 1.0)
    new = fast_allreduce_request("b", b, None, ReduceOp.Sum, 1.0, 1.0)
    buf = torch.empty(7)
    parts = list(buf.split([4, 3]))
    fusion.pack(parts, [in_place, new])
    assert buf.tolist() == [0, 1, 2, 3, 0, 1, 2]
    fusion.pack(parts, [None, new])  # a joined rank's part is zeros
    assert buf.tolist() == [0, 0, 0, 0, 0, 1, 2]
    buf.copy_(torch.arange(7.0))
    fusion.unpack(parts, [in_place, new], scale=0.5)
    assert a.tolist() == [[0, 0.5], [1, 1.5]]
    assert new.output.shape == b.shape and new.output.tolist() == [2, 2.5, 3]
    assert new.output.data_ptr() != buf.data_ptr() + 4 * 4  # a tensor of its own, not a view of the buffer


@pytest.mark.timeout(30)
def test_the_output_pool_reuses_a_buffer_once_its_result_is_dropped():
    pool = fusion.OutputPool()
    small = pool.empty((10,), torch.float32)
    assert pool.mapped == 0 and small.shape == (10,)  # small results: plain torch memory
    x = pool.empty((512, 1024), torch.float32)  # 2 MiB
    x.fill_(3.0)
    view = x[1]
    ptr = x.data_ptr()
    del x
    gc.collect(1)  # the young generations: a full collection of the suite's heap takes ~0.8 s late in a run
    y = pool.empty((2, 1 << 18), torch.float32)
    assert y.data_ptr() != ptr and pool.mapped == 2  # a view kept the first one alive
    del view, y
    gc.collect(1)
    z = pool.empty((1 << 19,), torch.bfloat16)
    assert pool.reused == 1 and z.dtype == torch.bfloat16 and z.shape == (1 << 19,)
    pool.clear()


# ---------------------------------------------------------------------------- stalls
def _negotiator(size: int = 3) -> tuple[Negotiator, ResponseCache]:
    cache = ResponseCache(8)
    return Negotiator(0, size, {0: ProcessSetInfo(0, range(size), None)}, cache), cache  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_a_stalled_op_is_warned_about_then_failed_naming_the_ranks_that_never_submitted_it(caplog):
    neg, cache = _negotiator()
    req = fast_allreduce_request("late", torch.ones(2), None, ReduceOp.Sum, 1.0, 1.0)
    p = neg.table["late"] = Pending("late", 1, first=0)
    p.keys = {0: req.key, 1: req.key}
    cfg = EngineConfig(stall_check_time=1.0, stall_shutdown_time=3.0)
    stats: collections.Counter = collections.Counter()
    inspector = StallInspector(cfg, neg, cache, stats)
    errors: dict[str, str] = {}
    with caplog.at_level(logging.WARNING, logger="hora.native.engine"):
        inspector.check(500, [], errors)
        assert not caplog.records
        inspector.check(1500, [], errors)
        inspector.check(2500, [], errors)  # warned once
    assert len(caplog.records) == 1 and "not by ranks [2]" in caplog.records[0].getMessage()
    assert stats["stall_warnings"] == 1 and not errors
    inspector.check(3100, [], errors)
    assert "late" not in neg.table and "ranks [2] never submitted it" in errors["late"]
    assert neg.poisoned["late"][1] == {2}  # rank 2 fails at once when it submits it after all


@pytest.mark.timeout(30)
def test_the_stall_failure_is_off_by_default_as_in_horovod(monkeypatch):
    monkeypatch.delenv("HORA_STALL_SHUTDOWN_TIME", raising=False)
    monkeypatch.setenv("HORA_COLLECTIVE_TIMEOUT", "7")
    assert EngineConfig().stall_shutdown_time == 0.0
    monkeypatch.setenv("HORA_STALL_SHUTDOWN_TIME", "7")
    assert EngineConfig().stall_shutdown_time == 7.0
    monkeypatch.setenv("HORA_STALL_SHUTDOWN_TIME", "0")
    monkeypatch.setenv("HORA_STALL_CHECK_TIME", "0")
    cfg = EngineConfig()
    assert cfg.stall_shutdown_time == 0.0 and cfg.stall_poll is None  # both off: no stall polling
    monkeypatch.setenv("HORA_STALL_SHUTDOWN_TIME", "-1")
    with pytest.raises(ConfigError, match=r"HORA_STALL_SHUTDOWN_TIME='-1' is invalid: it must be a number >= 0"):
        EngineConfig()
    monkeypatch.delenv("HORA_STALL_SHUTDOWN_TIME")
    with pytest.raises(ConfigError, match="op_timeout"):
        EngineConfig(op_timeout=0)


@pytest.mark.timeout(30)
def test_mismatched_keys_fail_every_submitter_naming_the_fields():
    neg, _ = _negotiator(size=2)
    a = fast_allreduce_request("x", torch.ones(2), None, ReduceOp.Sum, 1.0, 1.0)
    b = fast_allreduce_request("x", torch.ones(3, dtype=torch.float64), None, ReduceOp.Sum, 1.0, 1.0)
    ready: list = []
    errors: dict[str, str] = {}
    neg.process_metas([[("x", a.key, None)], [("x", b.key, None)]], now=0, round_no=1, ready=ready, errors=errors)
    assert not ready and "x" not in neg.table
    msg = errors["x"]
    assert "disagree on dtype, shape" in msg and "float32[2]" in msg and "float64[3]" in msg, msg


# ---------------------------------------------------------------------------- autotune
@pytest.mark.timeout(30)
def test_the_autotuner_proposes_each_candidate_then_keeps_the_best():
    now = [0.0]
    tuner = autotune.Autotuner(window=2, clock=lambda: now[0])
    n = len(tuner.candidates)
    assert n == len(autotune.THRESHOLDS) * len(autotune.CYCLES)
    assert tuner.proposal(0) == tuner.candidates[0] and tuner.proposal(0) is None  # applied once
    assert tuner.proposal(n) is None and tuner.proposal(-1) is None  # not candidates (I32_MAX: no proposal)
    resp = Response("t", fast_allreduce_request("t", torch.ones(256), None, ReduceOp.Sum, 1.0, 1.0).key, {0: None})
    best = 5
    for i in range(n):
        assert tuner.index == i
        for _ in range(2):
            now[0] += 0.001 if i == best else 0.01  # candidate 5 moves the bytes fastest
            tuner.observe([resp])
    assert tuner.done and tuner.index == best
    assert tuner.proposal(best) == tuner.candidates[best]


# ---------------------------------------------------------------------------- cache order, predicted rounds
@pytest.mark.timeout(30)
def test_touching_a_rounds_slots_again_skips_only_what_would_not_change_the_order():
    # a predicted round touches its slots every step; the cache skips the moves when the
    # same round did exactly that last, and the eviction order stays the one moving every
    # slot each time gives (every rank must evict alike)
    rng = np.random.default_rng(3)
    a, b = ResponseCache(8), ResponseCache(8)
    for c in (a, b):
        for i in range(8):
            c.put(f"t{i}", None, {})
    rounds = [[1, 3, 5], [0, 2], [7, 6, 5, 4]]
    for _ in range(200):
        k = int(rng.integers(0, 5))
        if k < 3:  # a round's touch (a's cache may skip it, b's never does)
            owner = rounds[k]
            a.touch_all(owner, owner)
            for s in owner:
                b.lru.move_to_end(s)
        elif k == 3:  # a general round's touch of some entries
            slots = sorted(set(rng.integers(0, 8, 3).tolist()))
            a.touch_all(slots)
            for s in slots:
                b.lru.move_to_end(s)
        else:  # a name replaced (erase and put: the slot moves to the recent end)
            name = f"t{int(rng.integers(0, 8))}"
            for c in (a, b):
                c.put(name, None, {})
        assert list(a.lru) == list(b.lru)
        assert [e.name for e in a.slots] == [e.name for e in b.slots]


def _spec_of(cache: ResponseCache, names: list[str], reqs: list[Request]):
    from hora.native.engine.speculation import Spec

    spec = Spec([cache.by_name[n].slot for n in names], names, [q.tensor.numel() for q in reqs], torch.float32, 1.0,
                1.0, False)
    spec.keep_entries(cache.by_name, cache.version)
    return spec


@pytest.mark.timeout(30)
def test_a_predicted_rounds_requests_are_matched_whole_only_when_exactly_its_own():
    def reqs(shapes, names):
        return [fast_allreduce_request(n, torch.zeros(s), None, ReduceOp.Sum, 1.0, 1.0) for s, n in zip(shapes, names)]

    names = [f"x{i}" for i in range(5)]
    shapes = [(3,), (2, 2), (3,), (1,), (4,)]
    first = reqs(shapes, names)
    cache = ResponseCache(16)
    for q in first:
        # the entries' keys as the round's metadata gives them: equal objects, not the same
        cache.put(q.name, type(q.key)(*q.key), {0: None, 1: None})
    spec = _spec_of(cache, names, first)
    assert spec.matches(reqs(shapes, names), 0)
    assert all(e.key is k for e, k in zip(spec.entries, spec.keys))  # the submit path's keys kept
    assert all(e.key is q.key for e, q in zip(spec.entries, reqs(shapes, names)))  # identity from now on
    assert spec.matches(reqs(shapes, names), 1)
    assert not spec.matches(reqs(shapes, names)[::-1], 0)  # another order
    assert not spec.matches(reqs(shapes, names)[:4], 0)  # one missing
    assert not spec.matches(reqs(shapes, names) + reqs([(3,)], ["x9"]), 0)  # one more
    assert not spec.matches(reqs(shapes[:4] + [(5,)], names), 0)  # another shape
    other = reqs(shapes, names)
    other[2] = fast_allreduce_request("x2", torch.zeros(3), None, ReduceOp.Max, 1.0, 1.0)
    assert not spec.matches(other, 0)  # another op
    with_local = reqs(shapes, names)
    with_local[0].local = (3, None)
    assert not spec.matches(with_local, 0)  # per-rank data
    cache.by_name["x1"].locals = {0: (2, None), 1: None}
    assert not spec.matches(reqs(shapes, names), 0)  # the entry's per-rank data on this rank
    assert spec.matches(reqs(shapes, names), 1)
    no_entries = _spec_of(cache, names, first)
    no_entries.entries = None  # a round only waited for locally: never matched whole
    assert not no_entries.matches(reqs(shapes, names), 1)


def test_foreach_clone_falls_back_to_one_clone_each_where_torch_lacks_it():
    """torch 2.11 (the CUDA image's) has no ``torch._foreach_clone``: the engine's fused unpack
    then clones one by one, with the same values in new storage."""
    import torch

    from hora.native.engine import fusion

    parts = [torch.arange(6.0).view(2, 3), torch.ones(4, dtype=torch.bfloat16)]
    got = fusion._clone_each(parts)
    assert [g.dtype for g in got] == [p.dtype for p in parts]
    assert all(torch.equal(g, p) and g.data_ptr() != p.data_ptr() for g, p in zip(got, parts))
    expected = getattr(torch, "_foreach_clone", None)
    assert fusion.foreach_clone is (expected if expected is not None else fusion._clone_each)
