"""A training rank's allocator (hora.estimators.worker.batches.steady_allocator): a step's buffers are reused,
not given back to the system and faulted in again page by page at every step."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"), reason="glibc's malloc"),
]

# A "step" that allocates four 3 MiB buffers and frees them (a small CNN's activations), 20 times:
# the page faults of those steps, in a fresh process, with or without steady_allocator.
_STEPS = textwrap.dedent("""
    import resource, sys
    import numpy as np
    if sys.argv[1] == "steady":
        from hora.estimators.worker.batches import steady_allocator
        assert steady_allocator()
    def step():
        blocks = [np.ones(3 << 20, np.uint8) for _ in range(4)]
        del blocks
    step(); step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def _faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _STEPS, mode], capture_output=True, text=True, timeout=90, env=env)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_steady_allocator_keeps_a_steps_buffers_instead_of_faulting_them_in_every_step():
    plain, steady = _faults("plain"), _faults("steady")
    # glibc's own rule: the heap is trimmed past twice the largest freed block (3 MiB), so each of the
    # 20 steps faults its 12 MiB in again (~3,000 pages); steadied, the buffers are reused
    assert plain > 20 * 1000, plain
    assert steady < 500, steady


def test_steady_allocator_leaves_the_users_own_malloc_settings_alone(monkeypatch):
    import hora.estimators.worker.batches as batches

    calls = []
    monkeypatch.setattr(batches, "_allocator", [])
    monkeypatch.setattr(batches.ctypes, "CDLL", lambda *a: calls.append(a))
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1048576")
    assert batches.steady_allocator() is False and calls == []
    assert batches.steady_allocator() is False  # decided once per process
    monkeypatch.setattr(batches, "_allocator", [])
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576")
    assert batches.steady_allocator() is False and calls == []
