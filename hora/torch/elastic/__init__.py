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
:func:`hora.native.elastic.run_fn`, shared by every framework.

Under ``hora run --min-np M --max-np N --host-discovery-script S`` ranks also join and
leave (:mod:`hora.runners.elastic.driver`): at each reset a worker takes its place in the job's
next round (its rank and the new size; a worker whose slot is gone exits), new workers
start on new slots and take the state from rank 0 (a survivor), and the reset callbacks
run with the new ``size()``. When the discovery script's hosts change, the next
``state.commit()`` raises :class:`~hora.errors.HostsUpdatedInterrupt` on every rank.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from hora.native.elastic import ObjectState, State, run_fn
from hora.torch.elastic.sampler import ElasticSampler
from hora.torch.elastic.state import TorchState


def _reset() -> None:
    from hora.native import ops
    from hora.runners.elastic import membership

    ops.shutdown()
    if membership.is_elastic():  # an elastic hora run: this worker's place in the next round
        membership.rejoin()
    ops.init()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``func(state, *args, **kwargs)`` to run in the elastic retry loop (module
    docstring). The first argument must be a :class:`TorchState` (any elastic State).
    Collectives must not be the wrapped call itself: ``func`` is where training runs.
    Under an elastic ``hora run`` the state also hears of host changes (its next commit
    raises ``HostsUpdatedInterrupt``)."""
    from hora.runners.elastic import membership

    @functools.wraps(func)
    def listening(state: Any, *args: Any, **kwargs: Any) -> Any:
        membership.host_updates.register(state)
        return func(state, *args, **kwargs)

    return run_fn(listening, _reset)


__all__ = ["run", "TorchState", "ElasticSampler", "State", "ObjectState"]
