"""Elastic training for torch (Horovod's ``hvd.elastic``): state that survives a failed
collective, and the decorator that retries from the last commit.

::

    import hora.torch as hvd
    hvd.init()
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch in range(state.batch, batches):
                step(...)
                if state.batch % 10 == 0:
                    state.commit()
            state.batch = 0

    train(state)

When a collective fails (:class:`~hora.errors.HorovodInternalError`, hora's
CollectiveError) inside ``train``, every rank restores the last commit, the job is reset
(``shutdown(); init()``: a new generation), the reset callbacks run, rank 0's state is
synchronized to every rank and ``train`` is called again. The loop itself is
:func:`hora.native.elastic.run_fn`, shared by every framework. hora jobs run a fixed set
of ranks (``hora run -np N``); ranks joining and leaving while a job runs are not
supported yet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hora.native.elastic import ObjectState, State, run_fn
from hora.torch.elastic.sampler import ElasticSampler
from hora.torch.elastic.state import TorchState


def _reset() -> None:
    from hora.native import ops

    ops.shutdown()
    ops.init()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``func(state, *args, **kwargs)`` to run in the elastic retry loop (module
    docstring). The first argument must be a :class:`TorchState` (any elastic State).
    Collectives must not be the wrapped call itself: ``func`` is where training runs."""
    return run_fn(func, _reset)


__all__ = ["run", "TorchState", "ElasticSampler", "State", "ObjectState"]
