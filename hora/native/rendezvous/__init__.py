"""Rendezvous: the environment contract and an authenticated key-value store.

A launcher (``hora run``, the Spark, Dask or local runner) starts a
:class:`RendezvousServer` and gives every worker its place in the job through
``HORA_*`` environment variables (see :class:`WorkerEnv` and :class:`Placement`).
Workers talk to the server with a :class:`KVClient` to exchange addresses and to meet
at barriers.

==============  ==================================================================
``contract``    the ``HORA_*`` variables, :class:`WorkerEnv`, :class:`Placement`,
                :func:`compute_placement`, :func:`make_secret`
``protocol``    signed frames: ``MAGIC | length | HMAC-SHA256 | body``, the HMAC
                checked before the body is unpickled
``server``      :class:`RendezvousServer`: one event loop for every connection; it never
                crashes because of a peer
``loop``        the server's event loop (one thread, one selector, non-blocking sockets)
``table``       the keys, per-key waiters and the change log (what changed since a number)
``client``      :class:`KVClient` and :func:`barrier`
``tls``         TLS for the server and its clients (``HORA_TLS``): a per-job certificate
                the clients pin, filed under the job's secret
==============  ==================================================================

This package imports neither torch nor the engine (a launcher imports it alone).
"""

from hora.errors import RendezvousError
from hora.native.rendezvous.client import KVClient, barrier
from hora.native.rendezvous.contract import (
    DEFAULT_RENDEZVOUS_TIMEOUT,
    DEFAULT_START_TIMEOUT,
    ENV_BACKEND,
    ENV_CROSS_RANK,
    ENV_CROSS_SIZE,
    ENV_HOSTNAME,
    ENV_JOB_ID,
    ENV_LOCAL_RANK,
    ENV_LOCAL_SIZE,
    ENV_RANK,
    ENV_RENDEZVOUS_ADDR,
    ENV_RENDEZVOUS_TIMEOUT,
    ENV_SECRET,
    ENV_SIZE,
    ENV_START_TIMEOUT,
    Placed,
    Placement,
    WorkerEnv,
    compute_placement,
    make_secret,
)
from hora.native.rendezvous.protocol import FRAME_TIMEOUT, AuthenticationError, FrameError, PeerClosedError, recv_exact
from hora.native.rendezvous.server import RendezvousServer

__all__ = [
    "WorkerEnv",
    "Placed",
    "Placement",
    "compute_placement",
    "RendezvousServer",
    "KVClient",
    "AuthenticationError",
    "FrameError",
    "PeerClosedError",
    "barrier",
    "make_secret",
    "RendezvousError",
]
