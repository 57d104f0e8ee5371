"""``hora.run``: Horovod's ``horovod.run`` on local ranks (ssh hosts: tests/ssh)."""

from __future__ import annotations

import os
import shutil
import sys
import time

import pytest

import hora
from hora.errors import ConfigError, WorkerFailedError

from .scoped import assert_no_ranks_left_since


def _train(scale):
    import torch

    import hora.torch as hvd

    hvd.init()  # as in Horovod, the function initialises hora itself
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, name="t")
    return hvd.rank(), hvd.size(), hvd.local_size(), float(total[0]) * scale


def _fail_on_rank_one():
    import hora.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise RuntimeError("rank one cannot go on")
    time.sleep(120)


@pytest.mark.timeout(240)
def test_hora_run_returns_each_rank_value_on_two_and_three_ranks_and_names_a_failure(tmp_path):
    t0 = time.time()
    assert hora.run(_train, args=(2.0,), num_proc=2, verbose=0) == [(0, 2, 2, 6.0), (1, 2, 2, 6.0)]
    with pytest.warns(DeprecationWarning, match="np is deprecated"):
        got = hora.run(_train, kwargs={"scale": 1.0}, np=3, verbose=0, output_filename=str(tmp_path / "out"))
    assert got == [(r, 3, 3, 6.0) for r in range(3)]
    assert (tmp_path / "out" / "rank.2" / "stdout").exists()
    with pytest.raises(WorkerFailedError) as info:
        hora.run(_fail_on_rank_one, num_proc=3, verbose=0)
    assert info.value.rank == 1 and info.value.host == "127.0.0.1"
    assert "RuntimeError: rank one cannot go on" in info.value.remote_traceback
    assert_no_ranks_left_since(t0, within=15)


@pytest.mark.parametrize("kwargs, message", [
    ({"min_num_proc": 2}, "min_num_proc (Horovod's elastic mode) is not supported"),
    ({"host_discovery_script": "discover.sh"}, "host_discovery_script (Horovod's elastic mode)"),
    ({"hosts": "a:1", "hostfile": "hosts.txt"}, "give hosts or hostfile, not both"),
    ({"use_gloo": True, "use_mpi": True}, "use_gloo and use_mpi cannot both be True"),
    ({"mpi_args": "-bind-to none"}, "mpi_args needs use_mpi=True"),
    ({"num_proc": 0}, "num_proc must be an int >= 1"),
    ({"hosts": "a:x"}, "slots must be an integer"),
])
def test_hora_run_refuses_what_it_cannot_do_before_starting_anything(kwargs, message):
    with pytest.raises(ConfigError) as info:
        hora.run(_train, args=(1.0,), **kwargs)
    assert message in str(info.value)


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_hora_run_with_use_mpi_goes_through_mpiexec():
    pytest.importorskip("mpi4py")
    if shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")) is None:
        pytest.skip("no mpiexec")

    def fn():
        import hora.torch as hvd

        hvd.init()
        return hvd.rank(), hvd.mpi_enabled()

    assert hora.run(fn, num_proc=2, use_mpi=True, verbose=0) == [(0, True), (1, True)]
