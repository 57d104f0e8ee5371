"""Heartbeats batched per host (hora.runners.rank.relay): the ranks of a run on one host beat in one
frame, a rank whose own beats stop is still reported lost, and a relay that is stopped or gone is
beaten around."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hora.errors import WorkerFailedError
from hora.native import keys
from hora.native.rendezvous import loop as loop_mod
from hora.native.rendezvous import make_secret
from hora.runners.rank import relay as relay_mod

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not relay_mod.supported(), reason="host-batched beats need Linux's abstract sockets")]


def _stop_a_member(folder: str) -> int:
    """Each rank says whether it is its host's relay; the highest rank that is not stops itself
    (SIGSTOP: its watchdog beats no more) and the others wait to be stopped by the driver."""
    from hora.runners.rank import main as rank_main

    rank = int(os.environ["HORA_RANK"])
    relay = rank_main._beater.relay
    deadline = time.monotonic() + 20
    while not (relay.is_relay or relay.offered) and time.monotonic() < deadline:
        time.sleep(0.05)  # until this rank is the relay, or one of its beats went through it
    with open(os.path.join(folder, f"{rank}.json.tmp"), "w") as fh:
        json.dump({"relay": relay.is_relay, "offered": relay.offered}, fh)
    os.replace(os.path.join(folder, f"{rank}.json.tmp"), os.path.join(folder, f"{rank}.json"))
    deadline = time.monotonic() + 20
    while len([n for n in os.listdir(folder) if n.endswith(".json")]) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    roles = {int(n.split(".")[0]): json.load(open(os.path.join(folder, n))) for n in os.listdir(folder)
             if n.endswith(".json")}
    victim = max(r for r, role in roles.items() if not role["relay"])
    if rank == victim:
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(30.0)
    return rank


def test_beats_go_in_one_frame_per_host_and_a_rank_missing_from_them_is_lost(monkeypatch, tmp_path):
    import hora.runners as hr

    monkeypatch.setenv("HORA_HEARTBEAT_TIMEOUT", "3")
    monkeypatch.setenv("HORA_TERMINATE_GRACE", "1")
    widest: list[int] = [0]
    original = loop_mod._Loop._request

    def count(self, conn, request):  # noqa: ANN001 - the loop's own signature
        if isinstance(request, tuple) and request[:1] == ("post",):
            beats = sum(str(w[1]).startswith(keys.HEARTBEAT) for w in request[1])
            widest[0] = max(widest[0], beats)
        return original(self, conn, request)

    monkeypatch.setattr(loop_mod._Loop, "_request", count)
    with pytest.raises(WorkerFailedError) as failed:
        hr.run(_stop_a_member, args=(str(tmp_path),), num_proc=3, backend="local", run_id="host-beats",
               verbose=0, init_native=False)
    roles = {int(p.name.split(".")[0]): json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(roles) == [0, 1, 2]
    assert sum(role["relay"] for role in roles.values()) == 1, roles  # one relay for the host
    assert all(role["offered"] > 0 for role in roles.values() if not role["relay"]), roles
    victim = max(r for r, role in roles.items() if not role["relay"])
    assert widest[0] >= 2, "no frame carried the beats of several ranks"
    message = str(failed.value)
    assert f"rank(s) [{victim}] stopped sending heartbeats" in message, message


HOLDER = r'''
import sys, time
from hora.runners.rank.relay import HostBeats
relay = HostBeats(bytes.fromhex(sys.argv[1]), bytes.fromhex(sys.argv[2]), 0.2)
print(relay.claim(), flush=True)
time.sleep(600)
'''


def test_a_stopped_relay_is_beaten_around_and_a_gone_one_replaced():
    secret = make_secret()
    name = relay_mod.relay_name(secret, "relay-test", 1, "127.0.0.1:1")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, secret.hex(), name.hex()], stdout=subprocess.PIPE,
                            text=True)
    member = relay_mod.HostBeats(secret, name, 0.2)
    try:
        assert proc.stdout.readline().strip() == "True"
        assert member.offer(5, b"metrics") == relay_mod.SENT
        time.sleep(0.3)
        assert member.offer(5, None) == relay_mod.SENT  # the relay read the first beat
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.3)
        member.offer(5, None)  # sent, or found the beat before it unread
        assert member.offer(5, None) == relay_mod.BUSY  # the stopped relay has not read it: post around it
        proc.kill()
        proc.wait()
        assert member.offer(5, None) == relay_mod.NO_RELAY
        assert member.claim() and member.is_relay
        other = relay_mod.HostBeats(secret, name, 10.0)
        wrong = relay_mod.HostBeats(make_secret(), name, 10.0)  # another job's secret: dropped
        try:
            assert other.offer(7, b"m7") == relay_mod.SENT
            assert wrong.offer(8, b"m8") == relay_mod.SENT
            deadline = time.monotonic() + 10
            writes: list = []
            while not writes and time.monotonic() < deadline:
                time.sleep(0.05)
                writes = member.take()
            assert writes == [("add", keys.rank_key(keys.HEARTBEAT, 7), 1),
                              ("set", keys.rank_key(keys.METRICS, 7), b"m7")]
        finally:
            other.close()
            wrong.close()
    finally:
        member.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
