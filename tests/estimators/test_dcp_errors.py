"""How a failed distributed checkpoint (``strategy="fsdp"``) is classified: a failed exchange
between the ranks is a collective failure (a symptom: the lost rank is the root cause and
``max_failures`` relaunches), the Store's failure a StoreError naming the checkpoint."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

from hora.errors import CollectiveError, FaultKind, StoreError  # noqa: E402
from hora.estimators.frameworks.torch.strategies import _dcp_error  # noqa: E402
from hora.runners.driver.faults import kind_of_exception  # noqa: E402

URL = "file:///store/runs/r/checkpoints/dcp-e000001"

pytestmark = pytest.mark.timeout(60)


def _mro(exc: BaseException) -> list[str]:
    return [f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__]


def test_a_peer_lost_during_the_plan_exchange_is_a_collective_failure_naming_the_checkpoint():
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:2968")
    err = _dcp_error(gloo, "writing", URL)
    assert isinstance(err, CollectiveError) and URL in str(err) and "Connection closed by peer" in str(err)
    assert kind_of_exception(_mro(err)) is FaultKind.COLLECTIVE and FaultKind.COLLECTIVE.symptom


@pytest.mark.parametrize("exc", [CheckpointException("write failed", {1: (OSError("disk full"), None)}),
                                 OSError(28, "No space left on device"), ValueError("bad plan")])
def test_the_stores_failure_is_a_store_error_naming_the_checkpoint(exc):
    err = _dcp_error(exc, "reading", URL)
    assert isinstance(err, StoreError) and f"reading the distributed checkpoint {URL} failed" in str(err)
    assert kind_of_exception(_mro(err)) is FaultKind.ERROR
