"""torch.distributed's default process group inside a hora rank.

hora builds its own Gloo/NCCL groups over a Store its rendezvous creates, and never the
default ``torch.distributed`` group, so code written for ``torch.distributed``
(``DistributedDataParallel``, FSDP2's ``fully_shard``, DTensor, torchmetrics' cross-rank
sync) had no group to run on under ``hora run``, ``hora.run`` or the estimators.
:func:`init_process_group` makes one from the same Store, with hora's rank and size:

>>> import hora.torch as hvd
>>> hvd.init()
>>> hvd.init_process_group()           # idempotent; jobs that never call it pay nothing
>>> ddp = torch.nn.parallel.DistributedDataParallel(model)

Gloo serves CPU tensors and, where CUDA and NCCL are present, NCCL serves CUDA tensors
(``"cpu:gloo,cuda:nccl"``). The group follows hora's init: after ``hvd.shutdown()`` and a
new ``hvd.init()`` the next call builds a new group over the new init's Store (the old one
is destroyed), and the group is destroyed before hora shuts down at exit.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import threading
from typing import Any

import torch
import torch.distributed as dist

from hora.errors import ConfigError, NotInitializedError

log = logging.getLogger(__name__)

_lock = threading.Lock()
_made_over: list[Any] = []  # the Store the default group hora made was built over (at most one)
_atexit_registered = False


def _backend_string() -> str:
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def init_process_group(timeout: float | None = None) -> Any:
    """Create (once per hora init) torch.distributed's default process group over hora's
    rendezvous, with hora's rank and size; return it (``torch.distributed.group.WORLD``).

    Args:
        timeout: seconds a collective of the group may take (default: hora's
            ``HORA_COLLECTIVE_TIMEOUT``).

    Raises:
        NotInitializedError: ``hvd.init()`` was not called first.
        ConfigError: the backend hora runs on has no Store to build the group over (name
            given), or a default group made by other code disagrees with hora's rank or size.
    """
    from hora.native import ops
    from hora.native.backends import collective_timeout

    if not ops.is_initialized():
        raise NotInitializedError("hora.torch.init_process_group() needs hora.torch.init() first")
    store = ops.torch_store()
    if store is None:
        raise ConfigError(f"the torch.distributed default group is built over hora's rendezvous Store, and hora's "
                          f"{ops.backend_name()!r} backend has none in this job")
    rank, size = ops.rank(), ops.size()
    global _atexit_registered
    with _lock:
        if dist.is_initialized():
            if _made_over and _made_over[0] is store:
                return dist.group.WORLD
            if not _made_over:  # the user's (or a framework's) own group: use it if it is the same job
                if dist.get_rank() != rank or dist.get_world_size() != size:
                    raise ConfigError(f"a torch.distributed default group already exists with rank "
                                      f"{dist.get_rank()} of {dist.get_world_size()}, but this hora rank is {rank} "
                                      f"of {size}")
                return dist.group.WORLD
            dist.destroy_process_group()  # made over an earlier hora init's Store, which is gone
            _made_over.clear()
        seconds = collective_timeout() if timeout is None else float(timeout)
        backend = _backend_string()
        dist.init_process_group(backend=backend, store=dist.PrefixStore("hora/torch-default/", store), rank=rank,
                                world_size=size, timeout=datetime.timedelta(seconds=seconds))
        _made_over.append(store)
        if not _atexit_registered:
            atexit.register(destroy_process_group)  # runs before hora's own shutdown at exit (LIFO)
            _atexit_registered = True
    log.debug("rank %d: torch.distributed default group (%s) of %d ranks over hora's rendezvous", rank, backend,
              size)
    return dist.group.WORLD


def destroy_process_group() -> None:
    """Destroy the default group :func:`init_process_group` made (a no-op otherwise)."""
    with _lock:
        if _made_over and dist.is_initialized():
            dist.destroy_process_group()
        _made_over.clear()


__all__ = ["init_process_group", "destroy_process_group"]
