"""hora.runners.rank.main.run_rank in this process, as a long-lived Ray actor runs it: whether
the rank returns or raises, its heartbeat thread is stopped when it ends (left running, it
would end the process at the driver's abort or when the finished run's driver goes away)."""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading

import cloudpickle
import pytest

from hora.native import keys
from hora.native.rendezvous import Placement, RendezvousServer
from hora.runners.spec import LaunchSpec, RankContext
from hora.runners.rank.main import run_rank


def _fails():
    raise KeyError("on purpose")


def _watchdogs() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "hora-watchdog" and t.is_alive()]


@pytest.mark.timeout(60)
def test_run_rank_stops_its_heartbeat_thread_however_the_rank_ends(tmp_path):
    secret = secrets.token_bytes(16)
    server = RendezvousServer(secret)
    server.start()
    env, path, level = dict(os.environ), list(sys.path), logging.getLogger().level
    ctx = RankContext(Placement(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1,
                                host="127.0.0.1"), rendezvous_addr=server.addr)
    try:
        for fn, code in ((lambda: 42, 0), (_fails, 1)):
            spec = LaunchSpec(payload=cloudpickle.dumps((fn, (), {})), fn_name="fn", num_proc=1, run_id="wd",
                              secret=secret, driver_addr=server.addr, verbose=0, init_native=False)
            assert run_rank(spec, ctx, str(tmp_path / "result.pkl")) == code
            assert not _watchdogs()
        assert server.keys(keys.rank_key(keys.FAILED, 0))  # the failure reached the driver first
    finally:
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = path
        logging.getLogger().setLevel(level)
        server.stop()
