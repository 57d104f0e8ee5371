"""The Gloo backend's shared-memory allreduce for ranks on one host (real processes)."""

from __future__ import annotations

import pytest

from hora.errors import ConfigError
from hora.native.backends.shm import availability
from tests.native import workers
from tests.spawn_util import run_ranks

needs_shm = pytest.mark.skipif(not availability()[0], reason=f"no shared memory here: {availability()[1]}")


@needs_shm
@pytest.mark.timeout(150)
# 0.001: 1 KiB pieces; spin 0: every step sleeps in recv until its peers' bytes come (the
# default polls first)
@pytest.mark.parametrize("size,buffer_mb,spin_us", [(2, "8", "50"), (3, "0.001", "50"), (2, "0.001", "0")])
def test_values_equal_the_exact_result_and_gloos(size, buffer_mb, spin_us):
    outs = run_ranks(workers.shm_backend_job, size, args=("values",),
                     env={"HORA_SHM_BUFFER_MB": buffer_mb, "HORA_SHM_SPIN_US": spin_us}, timeout=140)
    for r, o in enumerate(outs):
        assert o["shm"], r
        assert o["fails"] == [], (r, o["fails"][:10])
        assert o["left_in_dev_shm"] == [], (r, o["left_in_dev_shm"])
    if buffer_mb == "0.001":  # big tensors really went through in many pieces
        assert outs[0]["pieces"] > 1000, outs[0]["pieces"]


@needs_shm
@pytest.mark.timeout(150)
@pytest.mark.parametrize("hosts", [("127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"),
                                   ("127.0.0.1", "127.0.0.2", "127.0.0.1")])  # the second: one alone, interleaved
def test_ranks_on_several_hosts_reduce_per_host_then_across(hosts):
    # two "hosts" on loopback: Gloo binds each rank to its advertised address
    outs = run_ranks(workers.shm_backend_job, len(hosts), args=("values",),
                     rank_env={r: {"HORA_HOSTNAME": h} for r, h in enumerate(hosts)}, timeout=140)
    for r, o in enumerate(outs):
        assert o["kind"] == "HierarchicalReducer", (r, o["kind"])
        assert o["fails"] == [], (r, o["fails"][:10])
        assert o["left_in_dev_shm"] == [], (r, o["left_in_dev_shm"])
    alone = [r for r, h in enumerate(hosts) if hosts.count(h) == 1]
    assert [o["pieces"] == 0 for o in outs] == [r in alone for r in range(len(hosts))]


@pytest.mark.timeout(120)
def test_one_member_per_host_uses_gloo_alone():
    outs = run_ranks(workers.shm_backend_job, 2, args=("values",),
                     rank_env={0: {"HORA_HOSTNAME": "127.0.0.1"}, 1: {"HORA_HOSTNAME": "127.0.0.2"}}, timeout=110)
    assert [o["kind"] for o in outs] == ["NoneType", "NoneType"]
    assert [o["fails"] for o in outs] == [[], []]


@pytest.mark.timeout(120)
def test_one_rank_without_shared_memory_makes_every_rank_use_gloo():
    outs = run_ranks(workers.shm_backend_job, 2, args=("values",), rank_env={1: {"HORA_SHM_ALLREDUCE": "0"}},
                     timeout=110)
    assert [o["shm"] for o in outs] == [False, False]
    assert [o["fails"] for o in outs] == [[], []]


@pytest.mark.timeout(120)
def test_a_rank_whose_dev_shm_is_full_makes_every_rank_use_gloo_without_waiting():
    # 100 GiB halves do not fit: rank 2's segment fails (ENOSPC) at set-up, the others
    # learn it from the vote instead of waiting for a segment that never comes
    outs = run_ranks(workers.shm_backend_job, 3, args=("values",), rank_env={2: {"HORA_SHM_BUFFER_MB": "102400"}},
                     timeout=110)
    assert [o["shm"] for o in outs] == [False] * 3
    assert [o["fails"] for o in outs] == [[]] * 3


@needs_shm
@pytest.mark.timeout(120)
def test_a_rank_that_never_arrives_is_named_after_the_timeout():
    outs = run_ranks(workers.shm_backend_job, 2, args=("late",), env={"HORA_COLLECTIVE_TIMEOUT": "2"}, timeout=110)
    err = outs[0]["error"]
    assert err is not None and "rank 1 did not arrive within 2s" in err, err
    assert 1.5 < outs[0]["waited"] < 30


@needs_shm
@pytest.mark.timeout(120)
@pytest.mark.parametrize("spin_us", ["0", "1000000"])  # a long poll sees the closed end as readable too
def test_a_rank_that_is_gone_is_named_at_once_and_later_calls_fail_too(spin_us):
    outs = run_ranks(workers.shm_backend_job, 2, args=("gone",), env={"HORA_SHM_SPIN_US": spin_us}, timeout=110)
    err = outs[0]["error"]
    assert err is not None and "rank 1 closed its connection" in err, err
    assert outs[0]["again"] is not None and "earlier shared-memory collective failed" in outs[0]["again"]


@pytest.mark.timeout(30)
def test_bad_settings_are_config_errors(monkeypatch):
    from hora.native.backends import shm

    monkeypatch.setenv("HORA_SHM_ALLREDUCE", "maybe")
    with pytest.raises(ConfigError, match="HORA_SHM_ALLREDUCE"):
        shm.enabled()
    monkeypatch.setenv("HORA_SHM_BUFFER_MB", "-1")
    with pytest.raises(ConfigError, match="HORA_SHM_BUFFER_MB"):
        shm.buffer_bytes()
    from hora import settings

    monkeypatch.setenv("HORA_SHM_SPIN_US", "-5")
    with pytest.raises(ConfigError, match="HORA_SHM_SPIN_US"):
        settings.get(shm.ENV_SHM_SPIN_US)


@pytest.mark.timeout(30)
def test_segments_of_dead_processes_are_swept_and_nothing_else(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys
    import time

    from hora.native.backends import shm

    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tok = "0123456789abcdef" * 2
        names = {
            f"hora-{tok}-0-{dead.pid}": False,  # old, its process gone: swept
            f"hora-{tok}-0-{dead.pid}.sock": False,
            f"hora-{tok}-1-{live.pid}": True,  # its process lives
            f"hora-{tok}-2-{dead.pid}-x": True,  # not a hora name
            "other-file": True,
        }
        old = time.time() - 3600
        for n in names:
            (tmp_path / n).write_bytes(b"x")
            os.utime(tmp_path / n, (old, old))
        fresh = tmp_path / f"hora-{tok}-3-{dead.pid}"  # its process gone, but too recent
        fresh.write_bytes(b"x")
        shm._sweep_stale(600.0)
        assert {n: (tmp_path / n).exists() for n in names} == names
        assert fresh.exists()
    finally:
        live.kill()
        live.wait()
