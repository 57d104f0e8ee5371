"""A one-rank hora job in the test's own process (no child interpreter to start), for the tests of
code that needs an initialized job but no peers."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator


@contextlib.contextmanager
def one_rank_job(api: Any) -> Iterator[Any]:
    """``api.init()`` as a size-1 job (``hora.native``, ``hora.torch``, ...) with every ``HORA_*``
    variable of the environment set aside, then ``api.shutdown()`` and the variables back."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("HORA_")}
    api.init()
    try:
        yield api
    finally:
        api.shutdown()
        os.environ.update(saved)
