"""Process liveness on this host, shared by the runners (a rank's supervisor) and the store (a lease's owner)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one another user owns counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["pid_alive"]
