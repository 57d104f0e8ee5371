"""``hora.runner.util.threads``: Horovod's ``in_thread`` helper."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

logger = logging.getLogger(__name__)


def in_thread(target: Callable[..., Any], args: tuple = (), name: str | None = None, daemon: bool = True,
              silent: bool = False) -> threading.Thread:
    """Start ``target(*args)`` in a new (daemon) thread and return it; with ``silent`` an exception
    it raises is logged at DEBUG instead of printed by the thread's default handler."""
    if not isinstance(args, tuple):
        args = (args,)

    def run() -> None:
        try:
            target(*args)
        except BaseException:
            if not silent:
                raise
            logger.debug("thread %s failed", name or threading.current_thread().name, exc_info=True)

    thread = threading.Thread(target=run if silent else target, args=() if silent else args, name=name, daemon=daemon)
    thread.start()
    return thread


__all__ = ["in_thread"]
