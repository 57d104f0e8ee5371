"""The MPI backend, under a real ``mpiexec`` (MPICH from the virtualenv)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.mpi

ROOT = Path(__file__).resolve().parents[2]


def _mpiexec() -> str | None:
    cand = Path(sys.executable).parent / "mpiexec"
    if cand.exists():
        return str(cand)
    return shutil.which("mpiexec")


def _env(env_extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORA_")}
    env.update(env_extra)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(n: int, env_extra: dict[str, str], timeout: float) -> list[dict]:
    pytest.importorskip("mpi4py")
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("mpiexec not found")
    env = _env(env_extra)
    with tempfile.TemporaryDirectory(prefix="hora-mpi-") as out_dir:
        env["HORA_TEST_RESULT_DIR"] = out_dir
        proc = subprocess.run(
            [mpiexec, "-n", str(n), sys.executable, "-m", "tests.native.mpi_main"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        files = sorted(Path(out_dir).glob("rank*.json"))
        assert len(files) == n, [f.name for f in files] + [proc.stdout[-3000:] + proc.stderr[-3000:]]
        results = [json.loads(f.read_text()) for f in files]
    return sorted(results, key=lambda r: r["rank"])


@pytest.mark.timeout(90)
def test_a_collective_some_rank_never_joins_is_named_and_the_job_aborted():
    pytest.importorskip("mpi4py")
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("mpiexec not found")
    # (2 s: the watchdog notes a wait after 1 s and aborts after 2 + 1 + 1 s, so rank 1's note of
    # its barrier has 2.5 s to land before rank 0 names who never joined)
    env = _env({"HORA_TEST_MPI_MODE": "stuck", "HORA_COLLECTIVE_TIMEOUT": "2"})
    t0 = time.monotonic()
    proc = subprocess.run([mpiexec, "-n", "3", sys.executable, "-m", "tests.native.mpi_main"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=80)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    out += f"\n(mpiexec exit code {proc.returncode})"
    assert time.monotonic() - t0 < 60  # the ranks would sleep 120 s: the watchdog ended the job
    assert "did not complete within HORA_COLLECTIVE_TIMEOUT=2s: ranks [2] never joined it" in out, out[-3000:]
    assert "rank 1 waits in call 1 (barrier)" in out or "rank 0 waits in call 1 (allreduce)" in out, out[-3000:]


@pytest.mark.timeout(200)
def test_mpi_backend_every_op_and_engine_features():
    results = _run(2, {}, timeout=190)
    for r, out in enumerate(results):
        assert out["backend"] == "mpi"  # auto-detected from mpiexec's PMI_RANK
        assert out["rank"] == r and out["size"] == 2
        assert out["local"] == [r, 2, 0, 1]
        assert out["dtypes"] == [] and out["numpy"] == [] and out["async"] == [], out
        assert out["mismatch"] == [] and out["ooo"]
        f = out["fused"]
        assert f["ints_equal"] and f["max_equal"] and f["floats_close"] and f["fused_batches"] >= 1
