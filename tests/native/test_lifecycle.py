"""The engine's life cycle and its errors, on real processes: init/shutdown any number of
times without leaking, op errors that leave the engine usable, ranks that shut down,
join or stop while others still work."""

from __future__ import annotations

import pytest

from tests.native import lifecycle_workers as W
from tests.spawn_util import run_ranks


@pytest.mark.timeout(280)
def test_200_init_shutdown_cycles_leak_no_fd_thread_or_shared_memory():
    # (small shared-memory segments: the test is about their life cycle, not their speed)
    outs = run_ranks(W.cycles, 2, args=(200,), env={"HORA_SHM_BUFFER_MB": "0.25"}, timeout=270)
    for rank, out in enumerate(outs):
        assert out["wrong"] == [], (rank, out["wrong"])
        assert not out["initialized"]
        before, after = out["before"], out["after"]
        assert after["fds"] == before["fds"], (rank, before, after)
        assert after["threads"] == before["threads"] == ["MainThread"], (rank, before, after)
        assert after["shm"] == before["shm"] == [], (rank, before, after)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("size", [3])  # (2 ranks: the same code; Horovod's suite runs them on 2)
def test_every_kind_of_op_error_raises_and_the_next_ops_work(size):
    outs = run_ranks(W.errors_then_good_ops, size, env={"HORA_OP_TIMEOUT": "60"}, timeout=140)
    want = {
        "shape": "CollectiveError", "dtype": "CollectiveError", "root": "CollectiveError",
        "bad_root_arg": "ConfigError", "bad_splits": "ConfigError", "float_splits": "ConfigError",
        "scalar_reducescatter": "DataError", "adasum_reducescatter": "NotImplementedError",
        "adasum_int": "DataError", "duplicate": "ConfigError",
    }
    for rank, out in enumerate(outs):
        assert out["errors"] == want, (rank, out["errors"])
        moved = dict(out["moved"])
        assert moved.pop("trunc") == [-1, -3 * size], (rank, out["moved"])
        assert set(moved.values()) == {"ok"}, (rank, moved)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [3])  # (2 ranks: tests/torch/test_horovod_api.py joins on 2)
def test_ops_other_than_allreduce_fail_at_once_while_a_rank_has_joined(size):
    outs = run_ranks(W.join_then_other_ops, size, timeout=110)
    lasts = {out["last"] for out in outs}
    assert len(lasts) == 1 and lasts != {0}, outs  # the same on every rank; rank 0 joined first
    for rank, out in enumerate(outs):
        assert out["after"] == [float(size)], out
        if rank:
            assert out["avg"] == [float(size - 1)] * 2, out  # rank 0 contributed zeros
            for what in ("allgather", "broadcast"):
                named, seconds = out[what]
                assert named and seconds < 10, (what, out)


@pytest.mark.timeout(120)
def test_a_rank_that_shut_down_fails_the_ops_that_need_it_and_the_next_init_starts_afresh():
    r0, r1 = run_ranks(W.one_rank_shuts_down_early, 2, env={"HORA_SHUTDOWN_TIMEOUT": "60"}, timeout=110)
    named, seconds = r1["barrier"]
    assert named and seconds < 10, r1  # at once, not after the 60 s shutdown timeout
    assert r1["still_initialized"]
    assert r0["shutdown_s"] < 30, r0  # rank 1's reset let rank 0's shutdown finish
    assert r0["again"] == r1["again"] == [1.0]


@pytest.mark.timeout(150)
def test_shutdown_waits_for_its_engine_thread_stuck_in_shared_memory_before_releasing_it():
    # pool=False: rank 1 is stopped (SIGSTOP) mid-collective, not for a warm rank to survive
    r0, r1 = run_ranks(W.shutdown_while_peer_is_stopped, 2, args=(2.0,),
                       env={"HORA_SHUTDOWN_TIMEOUT": "2"}, timeout=140, pool=False)
    assert r0["handle_failed"], r0
    assert r0["shutdown_s"] < 10, r0
    assert r1["stuck"] == "CollectiveError", r1
    assert r0["again"] == r1["again"] == [3.0] * 3
    for out in (r0, r1):
        assert out["census"]["threads"] == ["MainThread"] and out["census"]["shm"] == [], out
