"""What the collective tests rely on in tests/spawn_util.run_ranks: ranks forked from the
warm server get the caller's environment of the moment (not the server's), a failing or
dying rank is reported, and a server holds exactly the modules its call asked for."""

from __future__ import annotations

import os
import sys

import pytest

from hora.errors import WorkerFailedError
from tests.spawn_util import run_ranks

_PROBE = "xml.dom.minidom"  # imported by nothing else here: its presence means the server preloaded it


def _environment() -> dict:
    return {"only_parent": os.environ.get("HORA_TEST_SPAWN_UTIL"), "per_rank": os.environ.get("HORA_TEST_PER_RANK"),
            "rank": os.environ["HORA_RANK"], "torch": "torch" in sys.modules, "probe": _PROBE in sys.modules}


def _fail(how: str) -> None:
    if os.environ["HORA_RANK"] == "1":
        if how == "raise":
            raise ValueError("rank 1 fails on purpose")
        os._exit(3)


def test_ranks_see_the_callers_environment_of_the_moment(monkeypatch):
    monkeypatch.setenv("HORA_TEST_SPAWN_UTIL", "set")
    first = run_ranks(_environment, 2, rank_env={1: {"HORA_TEST_PER_RANK": "one"}}, timeout=60)
    assert [(o["rank"], o["only_parent"], o["per_rank"]) for o in first] == [("0", "set", None), ("1", "set", "one")]
    assert all(o["torch"] for o in first)  # forked from the warm server
    monkeypatch.delenv("HORA_TEST_SPAWN_UTIL")
    assert run_ranks(_environment, 1, timeout=60)[0]["only_parent"] is None


@pytest.mark.parametrize("how, message", [("raise", "rank 1 raised ValueError"), ("exit", "rank 1 died with exit code 3")])
def test_a_failing_rank_is_reported(how, message):
    with pytest.raises(WorkerFailedError, match=message):
        run_ranks(_fail, 2, args=(how,), timeout=60)


def test_a_server_holds_exactly_the_modules_its_call_asked_for():
    assert [o["probe"] for o in run_ranks(_environment, 2, preload=(_PROBE,), timeout=60)] == [True, True]
    assert [o["probe"] for o in run_ranks(_environment, 2, timeout=60)] == [False, False]
    assert run_ranks(_environment, 1, fresh=True, timeout=60)[0]["probe"] is False
