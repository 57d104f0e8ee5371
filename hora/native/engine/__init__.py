"""The collective engine: name-matched negotiation, response cache, fusion, predicted rounds.

One background thread per process owns the backend; callers enqueue named requests
(:meth:`Engine.submit`) and get a :class:`Handle`. The package, one concern per module:

==================  ==================================================================
``config``          :class:`EngineConfig` (frozen, from the ``HORA_*`` settings), ``Tuning``
``request``         op kinds, :class:`OpKey` (what ranks agree on), requests and handles
``control``         the round's control vector: layout, encode/decode (normal and tail form)
``negotiation``     the replicated table of pending names, joins, shutdowns, mismatches
``cache``           agreed responses and the response cache (one bit per op per round)
``stalls``          ops some ranks never submit: warned, then failed naming the ranks
``fusion``          grouping into fused collectives; the one copy-in and copy-out
``execute``         one executor per op kind; allreduce through fused groups and plans
``speculation``     predicted rounds: one collective carrying data and negotiation
``autotune``        proposes fusion threshold and cycle time (the engine applies them)
``state``           :class:`EngineState`: what the parts share (tables, hand-over, completion)
``loop``            :class:`RoundLoop`, the background thread: idle waits, rounds, what follows
``engine``          :class:`Engine`: owns the state and the parts; submission, blocking
                    callers, shutdown, release
==================  ==================================================================

Semantics worth knowing: names are matched per process set; a name may be in flight only
once per rank and process set; integer Average rounds toward zero (as Horovod); a burst
of submissions is gathered (up to 10 cycles, ended early by any caller that blocks on a
handle or by ``ops.end_burst()``) before it is negotiated, so it is fused. Shutdown is
collective (``Engine.shutdown``); op errors fail only the ops concerned, and the engine
stops only when a rank is lost. Settings: ``hora check --env`` or README's table.
"""

from hora.native.engine.cache import CacheEntry, Response, ResponseCache
from hora.native.engine.config import EngineConfig, Tuning
from hora.native.engine.control import ControlVector
from hora.native.engine.engine import Engine
from hora.native.engine.request import (
    ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, JOIN, PS_ADD, PS_REMOVE, QUIT, REDUCESCATTER, Handle, OpKey,
    OpKind, Request, auto_name, fast_allreduce_request, is_one_off,
)
from hora.native.engine.speculation import Spec
from hora.native.engine.state import EngineState

_Spec = Spec  # (the name the tests of predicted rounds use)

__all__ = [
    "ALLGATHER", "ALLREDUCE", "ALLTOALL", "BARRIER", "BROADCAST", "JOIN", "PS_ADD", "PS_REMOVE", "QUIT",
    "REDUCESCATTER", "CacheEntry", "ControlVector", "Engine", "EngineConfig", "EngineState", "Handle", "OpKey",
    "OpKind", "Request", "Response", "ResponseCache", "Spec", "Tuning", "auto_name", "fast_allreduce_request",
    "is_one_off",
]
