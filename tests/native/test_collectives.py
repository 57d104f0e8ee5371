"""Multi-process tests of hora.native on Gloo over loopback (real processes, real rendezvous)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.native import workers
from tests.spawn_util import run_ranks


@pytest.mark.timeout(150)
@pytest.mark.parametrize("size,shm", [(2, "1"), (3, "1"), (2, "0")])  # shm 0: allreduce over Gloo's TCP too
def test_every_op_every_dtype_every_reduction_torch(size, shm):
    fails = run_ranks(workers.all_ops_all_dtypes, size, env={"HORA_SHM_ALLREDUCE": shm}, timeout=140)
    assert fails == [[]] * size, fails


@pytest.mark.timeout(150)
def test_every_op_every_dtype_on_two_hosts_of_two_ranks():
    # two "hosts" on loopback: allreduce per host through shared memory, then across hosts
    hosts = {0: "127.0.0.1", 1: "127.0.0.1", 2: "127.0.0.2", 3: "127.0.0.2"}
    fails = run_ranks(workers.all_ops_all_dtypes, 4, rank_env={r: {"HORA_HOSTNAME": h} for r, h in hosts.items()},
                      timeout=140)
    assert fails == [[]] * 4, fails


@pytest.mark.timeout(150)
def test_every_op_every_dtype_numpy():
    fails = run_ranks(workers.all_ops_all_dtypes, 2, args=(True,), timeout=140)
    assert fails == [[]] * 2, fails


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [3])  # 2 ranks: covered by the MPI job, which runs the same worker
def test_async_handles_objects_compression_join(size):
    outs = run_ranks(workers.async_objects_compression, size, timeout=110)
    for r, out in enumerate(outs):
        assert out["fails"] == [], (r, out["fails"])
    # rank 0 joined first; the last rank to join is one of the others
    assert all(o["last_joined"] == outs[0]["last_joined"] for o in outs)
    assert outs[0]["last_joined"] != 0


@pytest.mark.timeout(120)
def test_process_sets_three_ranks():
    fails = run_ranks(workers.process_sets, 3, timeout=110)
    assert fails == [[]] * 3, fails


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [3])  # 2 ranks: covered by the MPI job
def test_mismatch_raises_on_every_rank_and_engine_recovers(size):
    outs = run_ranks(workers.mismatches, size, env={"HORA_OP_TIMEOUT": "60"}, timeout=110)
    for r, msgs in enumerate(outs):
        assert not [m for m in msgs if m.startswith("NO ")], (r, msgs)
        shape, dtype, op, root, kind, ag, cached, dup = msgs
        assert "bad.shape" in shape and "shape" in shape and f"ranks {list(range(size))}" in shape
        assert "bad.dtype" in dtype and "float64" in dtype and "float32" in dtype
        assert "bad.op" in op and "op" in op
        assert "bad.root" in root and "root_rank" in root
        assert "bad.kind" in kind and "kind" in kind
        assert "bad.ag" in ag
        assert "good.after" in cached and "shape" in cached
        assert "dup" in dup and "already in flight" in dup


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [3])  # 2 ranks: covered by the MPI job
def test_out_of_order_submission(size):
    outs = run_ranks(workers.out_of_order, size, timeout=110)
    assert all(o["ok"] for o in outs), outs
    assert outs[0]["order"] != outs[1]["order"]  # the ranks really did submit differently


@pytest.mark.timeout(120)
def test_stall_warning_names_tensor_and_missing_rank():
    outs = run_ranks(workers.stall, 2, args=(1, 3.0, False), env={"HORA_STALL_CHECK_TIME": "1"}, timeout=110)
    assert outs[0]["value"] == [2.0, 2.0] and outs[1]["value"] == [2.0, 2.0]
    warned = outs[0]["warnings"]
    assert warned, outs
    assert "late.tensor" in warned[0] and "not by ranks [1]" in warned[0]
    assert "late.tensor" in outs[0]["timeout"] and "never by ranks [1]" in outs[0]["timeout"]


@pytest.mark.timeout(120)
def test_a_predicted_round_one_rank_never_submits_still_times_out_naming_it():
    # after steps in lockstep the late step is a predicted round, which the blocked caller
    # runs in its own thread while the late rank's engine sleeps: the late rank's engine
    # still runs the round within its stall poll, so the caller's timeout names the rank
    # (16 steps: the first 4 are negotiated, so 12 are predicted and a caller that misses a
    # few offers on a loaded machine still runs 4; a cycle of 100 ms keeps each offer open
    # long enough, as in the test below)
    outs = run_ranks(workers.stall, 2, args=(1, 3.0, False, 16),
                     env={"HORA_STALL_CHECK_TIME": "1", "HORA_CYCLE_TIME": "100"}, timeout=110)
    assert outs[0]["steady_stats"].get("speculation_hits", 0) >= 4, outs[0]["steady_stats"]
    assert outs[0]["steady_stats"].get("rounds_run_by_caller", 0) >= 4, outs[0]["steady_stats"]
    assert outs[0]["value"] == [2.0, 2.0] and outs[1]["value"] == [2.0, 2.0]
    assert "late.tensor" in outs[0]["timeout"] and "never by ranks [1]" in outs[0]["timeout"], outs[0]
    assert outs[0]["t"][0] < 60, outs[0]["t"]  # (the late rank came after 3 s: nothing waited for a long poll)


@pytest.mark.timeout(120)
def test_stall_shutdown_time_turns_the_stall_into_an_error():
    env = {"HORA_STALL_CHECK_TIME": "0.5", "HORA_STALL_SHUTDOWN_TIME": "1.5"}
    outs = run_ranks(workers.stall, 3, args=(2, 4.0, True), env=env, timeout=110)
    for o in outs:
        assert "error" in o, outs
        assert "late.tensor" in o["error"] and "[2]" in o["error"]


@pytest.mark.timeout(120)
def test_fused_equals_unfused():
    outs = run_ranks(workers.fused_vs_unfused, 2, timeout=110)
    for o in outs:
        assert o["ints_equal"] and o["max_equal"] and o["floats_close"], o
        assert o["fused_batches"] >= 1, o


@pytest.mark.timeout(120)
def test_response_cache_hit_counters():
    outs = run_ranks(workers.cache_counters, 2, args=(5, 20), timeout=110)
    for o in outs:
        assert o["ok"]
        hits = [h for h, _ in o["hist"]]
        misses = [m for _, m in o["hist"]]
        assert misses[0] == 20 and hits[0] == 0  # first step: everything negotiated by name
        assert misses[-1] == 20 and hits[-1] == 80  # later steps: all from the cache
    assert outs[0]["hist"] == outs[1]["hist"]


@pytest.mark.timeout(120)
def test_small_cache_and_tensor_larger_than_fusion_threshold():
    env = {"HORA_CACHE_CAPACITY": "5", "HORA_FUSION_THRESHOLD": "4096"}
    outs = run_ranks(workers.small_cache_and_big_tensor, 2, env=env, timeout=110)
    for o in outs:
        assert o["cache"]["ok"], o
        assert o["cache"]["stats"]["cache_size"] <= 5  # a working set of 12 through 5 slots
        assert o["big"]  # 200 KB tensor with a 4 KB threshold, small ones fused around it


@pytest.mark.timeout(120)
def test_cache_disabled_and_fusion_disabled():
    env = {"HORA_CACHE_CAPACITY": "0", "HORA_FUSION_THRESHOLD": "0"}
    outs = run_ranks(workers.cache_counters, 2, args=(3, 10), env=env, timeout=110)
    for o in outs:
        assert o["ok"] and o["stats"].get("cache_hits", 0) == 0
        assert o["stats"].get("fused_batches", 0) == 0


@pytest.mark.timeout(120)
def test_timeline_is_valid_chrome_trace_with_phases(tmp_path):
    from hora.native.timeline import summarize

    path = tmp_path / "timeline.json"
    outs = run_ranks(workers.timeline_job, 2, args=(str(path),),
                     env={"HORA_TIMELINE": str(path), "HORA_TIMELINE_MARK_CYCLES": "1"}, timeout=110)
    assert outs[0]["exists"]
    doc = json.loads(path.read_text())
    names = {e["name"] for e in doc["traceEvents"]}
    for phase in ("NEGOTIATE", "QUEUE", "FUSE_COPY_IN", "COLLECTIVE", "FUSE_COPY_OUT", "CYCLE_START",
                  "NEGOTIATION_ROUND"):
        assert phase in names, (phase, names)
    rows = {e["args"]["name"] for e in doc["traceEvents"] if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert {"tl.0", "tl.bc", "engine"} <= rows
    text = summarize(str(path))
    assert "NEGOTIATE" in text and "COLLECTIVE" in text and "total ms" in text


@pytest.mark.timeout(150)
def test_autotune_picks_and_logs_a_setting():
    env = {"HORA_AUTOTUNE": "1", "HORA_AUTOTUNE_WINDOW": "3"}
    outs = run_ranks(workers.autotune_job, 2, args=(120,), env=env, timeout=140)
    assert all(o["ok"] for o in outs)
    assert any("autotune: chose" in m for m in outs[0]["log"]), outs[0]
    # every rank applied rank 0's choice
    assert outs[0]["stats"]["fusion_threshold"] == outs[1]["stats"]["fusion_threshold"]


@pytest.mark.timeout(120)
def test_waiting_for_a_late_rank_costs_no_polling_rounds():
    # rank 1 arrives 30 ms after rank 0 at every op: rank 0's engine must wait for it
    # without running a collective round per cycle (each one takes CPU from the late
    # rank), and nobody lingers in empty rounds after the op
    outs = run_ranks(workers.rounds_per_op, 2, args=(15, 1, 0.03), timeout=110)
    for o in outs:
        assert o["ok"], outs
        assert o["rounds_per_op"] <= 3.0, outs


@pytest.mark.timeout(120)
def test_cached_process_set_op_and_a_rank_outside_it_shutting_down_first():
    # a cached op on a process set is ready when its *members* have it (a rank outside
    # the set never submits it), and shutdown is collective: rank 2 keeps answering
    # rounds until ranks 0 and 1 are done, instead of cutting their Gloo connections
    outs = run_ranks(workers.process_set_repeated_and_early_shutdown, 3, args=(5,),
                     env={"HORA_STALL_CHECK_TIME": "20"}, timeout=110)
    for r in (0, 1):
        assert outs[r]["values"] == [1.0 + 2 * i for i in range(5)], outs[r]
        assert outs[r]["late"] == 2.0
        # served from the cache (before the fix, every repeat waited for the stall logic
        # to drop the slot and renegotiate the name)
        assert outs[r]["cache_hits"] >= 4, outs[r]


def _assert_predicted_missed_resumed(rank: int, o: dict) -> None:
    """Exact results; steady rounds all predicted hits; the disrupted step missed at least
    once; prediction resumed afterwards."""
    assert o["fails"] == [], (rank, o["fails"])
    steady, s = o["steady"], o["stats"]
    assert steady.get("speculation_hits", 0) >= 4, steady
    assert steady.get("speculation_misses", 0) == 0, steady
    assert s.get("speculation_misses", 0) >= 1, s
    assert s["speculation_hits"] >= steady["speculation_hits"] + 4, s


@pytest.mark.timeout(120)
def test_predicted_rounds_run_as_one_collective_and_survive_a_misprediction():
    outs = run_ranks(workers.speculation_job, 2, args=(6,), timeout=110)
    for r, o in enumerate(outs):
        # the two fused groups alternate; once each successor was seen twice, rounds are
        # predicted and carry their negotiation in the data's collective; the split step
        # misses (rank 1 lacked the prediction)
        _assert_predicted_missed_resumed(r, o)
    assert outs[0]["stats"]["speculation_hits"] == outs[1]["stats"]["speculation_hits"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("inplace,disrupt", [(False, "order"), (True, "late")])
def test_a_steady_round_of_many_small_tensors_is_matched_whole_and_survives_a_disruption(inplace, disrupt):
    # the steady state of 200 named tensors (beyond the 64 slots of the control tail's
    # list path) is recognized by comparing whole lists; a rank that submits them in
    # another order goes through the per-request match, one that lacks some misses the
    # prediction; every result stays exact, and the round never compares a tensor with
    # None through torch (once a thousandfold slowdown of the in-place round)
    outs = run_ranks(workers.many_small_predicted, 2, args=(6, inplace, disrupt), timeout=140)
    for r, o in enumerate(outs):
        assert o["fails"] == [], (r, o["fails"][:5])
        assert o["eq_none"] == 0, o["eq_none"]
        steady, s = o["steady"], o["stats"]
        assert steady.get("speculation_hits", 0) >= 2, steady
        assert steady.get("rounds_matched_whole", 0) >= 2, steady
        assert s["rounds_matched_whole"] >= steady["rounds_matched_whole"] + 3, s
        if disrupt == "late":
            assert s.get("speculation_misses", 0) >= 1, s
    assert outs[0]["stats"]["speculation_hits"] == outs[1]["stats"]["speculation_hits"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("between", ["allreduce", "barrier", "grouped"])
def test_unnamed_ops_between_steps_keep_the_steps_predicted_and_out_of_the_cache(between):
    # an unnamed op gets a made-up name that never comes again: it is negotiated by name
    # each time; before, that started the chain of predicted rounds over every step (no
    # step was ever predicted) and filled the response cache with dead names
    outs = run_ranks(workers.unnamed_ops_between_steps, 2, args=(20, between), timeout=140)
    for o in outs:
        assert o["fails"] == [], o["fails"]
        steady, s = o["steady_from"], o["stats"]
        # the 14 steps after the 6th are predicted (the first steps learn the chain; a
        # loaded machine may split one of them); a barrier or an unnamed allreduce between
        # them is never mistaken for a step: that would miss the prediction at every one of the 14
        # steps; one miss is a step whose 6 submissions a loaded machine split across two cycles
        assert s.get("speculation_hits", 0) - steady.get("speculation_hits", 0) >= 12, s
        assert s.get("speculation_misses", 0) - steady.get("speculation_misses", 0) <= 1, s
        assert set(o["cache_sizes"]) == {6}, o["cache_sizes"]  # the 6 named tensors only
    # the barrier without a backend barrier of its own still waits for every rank
    assert outs[0]["left"] >= outs[1]["entered"], (outs[0]["left"], outs[1]["entered"])


@pytest.mark.timeout(150)
def test_small_allgathers_go_through_shared_memory_bit_for_bit():
    # an allgather of at most 64 KiB among ranks on one host (a round's metadata, most
    # allgather_object calls) is a shared-memory Sum of bytes, each rank's in its place
    # and zeros elsewhere; bigger ones go through Gloo; either way every byte is exact
    sizes = [1, 7, 4096, 16384]  # per rank; 3 ranks x 16384 x 8 bytes is above 64 KiB
    outs = run_ranks(workers.small_allgathers, 3, args=(sizes,), timeout=140)
    itemsizes = [1, 1, 2, 8, 2, 2, 4, 8, 1]  # the worker's dtypes
    above = sum(1 for n in sizes for b in itemsizes if 3 * n * b > 64 * 1024)
    assert above == 8
    for o in outs:
        assert o["fails"] == [], o["fails"]
        assert o["through_gloo"] == above, o["through_gloo"]  # (the rounds' metadata: never)


@pytest.mark.timeout(120)
def test_speculation_can_be_switched_off():
    outs = run_ranks(workers.speculation_job, 2, args=(4,), env={"HORA_SPECULATE": "0"}, timeout=110)
    for o in outs:
        assert o["fails"] == []
        assert o["stats"].get("speculation_hits", 0) == 0
        assert o["stats"].get("speculation_misses", 0) == 0


@pytest.mark.timeout(120)
def test_a_caller_blocking_on_a_handle_runs_the_predicted_round_itself():
    # the engine offers a complete predicted round for one cycle (100 ms here, so the
    # caller is surely in time) to a caller that blocks on a handle; it runs it in its own
    # thread, sparing two hand-overs between threads
    # (16 steps: the first 4 are negotiated, the 12 predicted leave room for missed offers)
    outs = run_ranks(workers.caller_runs_predicted_round, 2, args=(16,), env={"HORA_CYCLE_TIME": "100"},
                     timeout=110)
    for o in outs:
        assert o["fails"] == []
        assert o["stats"].get("speculation_hits", 0) >= 4, o["stats"]
        assert o["stats"].get("rounds_run_by_caller", 0) >= 4, o["stats"]


@pytest.mark.timeout(10)
def test_an_unclaimed_round_stops_being_offered_and_is_offered_again_later():
    from hora.native.engine import _Spec

    spec = _Spec([0], ["x"], [4], torch.float32, 1.0, 1.0, False)
    assert spec.should_offer()
    spec.unclaimed = 2  # two offers in a row nobody took
    asked = [spec.should_offer() for _ in range(16)]
    assert asked == [False] * 16  # the engine thread runs it at once meanwhile
    assert spec.should_offer()  # the 17th: offered again (the caller may have sped up)
    spec.unclaimed = 0  # a claim resets the count
    assert spec.should_offer()


@pytest.mark.timeout(120)
def test_a_lone_big_tensor_is_not_predicted_but_reduced_in_place():
    # predicting a round copies its data through the fusion buffer; for one tensor above
    # 1 MiB that costs more than the negotiation it saves, so it stays a normal round
    outs = run_ranks(workers.lone_tensor_predictions, 2, args=(6,), timeout=110)
    for o in outs:
        assert o["ok"]
        assert o["small"] >= 2, o
        assert o["big"] == 0, o


@pytest.mark.timeout(120)
def test_each_optimizer_bucket_is_a_predicted_round_of_its_own():
    # two DDP-style buckets, backward pausing between them: the first bucket is reduced
    # during the pause, the second after backward, each as one predicted round per step
    outs = run_ranks(workers.optimizer_buckets_become_rounds, 2, args=(8,), timeout=110)
    for o in outs:
        assert o["buckets"] == 2
        assert o["per_step"][-4:] == [2, 2, 2, 2], o["per_step"]  # predicted rounds completed per step
        assert o["stats"].get("speculation_misses", 0) == 0, o["stats"]
    assert outs[0]["checksum"] == outs[1]["checksum"]  # the ranks stay in step


@pytest.mark.timeout(150)
@pytest.mark.parametrize("size", [2, 3])
def test_rounds_in_place_in_spare_room_survive_a_misprediction(size):
    # with 3 ranks two of them hold the prediction and sum their tensors in place before
    # the round turns out mispredicted: the lowest keeps that partial sum, the other
    # zeroes its tensor, and the normal round that follows still gives the exact result
    outs = run_ranks(workers.room_rounds_survive_a_misprediction, size, args=(6,), timeout=140)
    for r, o in enumerate(outs):
        _assert_predicted_missed_resumed(r, o)
        steady, s = o["steady"], o["stats"]
        assert s.get("fused_batches", 0) == steady.get("fused_batches", 0)  # in place: no fusion buffer
        # a hit with nothing else going on anywhere ends the round without decoding the rest
        assert steady.get("speculation_alone", 0) == steady["speculation_hits"], steady
        assert "room_elements() = " in o["refused"], o["refused"]


@pytest.mark.timeout(120)
def test_end_burst_negotiates_what_is_gathered_at_once():
    outs = run_ranks(workers.end_burst_negotiates_at_once, 2, env={"HORA_CYCLE_TIME": "300"}, timeout=110)
    for o in outs:
        assert o["plain_ok"] and o["end_burst_ok"]
        assert o["plain"] is False  # still gathering: a 300 ms cycle has not passed quietly
        assert o["end_burst"] is True  # negotiated and reduced while the caller slept
