"""Faults the store tests inject from outside the library: a materialization that waits, its data
written and staged, before its commit (the window in which another attempt runs, or the writer is killed)."""

from __future__ import annotations

import time


def delay_commit(monkeypatch, seconds: float) -> None:
    """Materializations in this process sleep ``seconds`` before committing (``hora.store.materialize.commit``
    wrapped for the test)."""
    import importlib

    materialize_module = importlib.import_module("hora.store.materialize")  # (hora.store.materialize: the function)

    commit = materialize_module.commit

    def _delayed(*args, **kwargs):
        time.sleep(seconds)
        return commit(*args, **kwargs)

    monkeypatch.setattr(materialize_module, "commit", _delayed)


def delayed_commit_code(seconds: float) -> str:
    """Python source that makes the process running it sleep ``seconds`` before each materialization's commit
    (for a script run in a child process)."""
    return (
        "import time as _time\n"
        "import importlib\n"
        "_materialize = importlib.import_module('hora.store.materialize')\n"
        "_commit = _materialize.commit\n"
        "def _delayed(*args, **kwargs):\n"
        f"    _time.sleep({float(seconds)!r})\n"
        "    return _commit(*args, **kwargs)\n"
        "_materialize.commit = _delayed\n"
    )
