"""Reading what scenario workers return from their ranks (each scenario's ``(ok, value)`` per rank),
and comparing model states across ranks; shared by the rank-scenario tests of torch, lightning and
the sharded optimizer."""

from __future__ import annotations

from typing import Any

import pytest


def result(per_rank: list[dict], name: str, label: str = "") -> list[Any]:
    """Each rank's value of scenario ``name``; fails the test with the rank's traceback if one failed."""
    prefix = f"[{label}] " if label else ""
    values = []
    for r, res in enumerate(per_rank):
        ok, value = res[name]
        if not ok:
            pytest.fail(f"{prefix}scenario {name!r} failed on rank {r}:\n{value}")
        values.append(value)
    return values


def assert_close(got: dict, want: dict, atol: float, what: str) -> None:
    """Two state dicts with the same keys whose tensors differ by at most ``atol``."""
    assert got.keys() == want.keys(), what
    for k in want:
        diff = (got[k].double() - want[k].double()).abs().max().item()
        assert diff <= atol, f"{what}: {k} differs by {diff:.3g} > {atol:g}"


def assert_identical(states: list[dict], what: str) -> None:
    """The same state dict, bitwise, on every rank."""
    import torch

    for k in states[0]:
        for r in range(1, len(states)):
            assert torch.equal(states[0][k], states[r][k]), f"{what}: {k} differs between rank 0 and rank {r}"
