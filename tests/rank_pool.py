"""A pool of 2 warm rank processes kept for the whole test session.

:func:`tests.spawn_util.run_ranks` serves its 2-rank calls here unless the call asks for
``fresh=True``, another ``preload`` or ``pool=False``: the two processes are forked once
from the fork server (torch and ``hora.native`` already imported) and then run one call
after another, rank ``i`` of every call on process ``i``. Each call is otherwise what a
fresh fork gets: its own rendezvous server and ``HORA_*`` variables, ``os.environ``
cleared and set to the call's environment, hora's log level applied again, and the
random generators (Python's, numpy's, torch's) put back to the state the fork server
left them in (two ranks forked from one server draw the same numbers, which some tests
rely on); each call is a job with an id of its own (``run_ranks``), so the generations a
process joined in earlier jobs (``hora.native.backends.join_generation``) do not matter.

A process serves the next call only if the call left nothing behind that a later test
could see; the pool is *retired* (both processes killed, a fresh pair forked on the next
call) when a rank raised, died or timed out, or after its function returned, either rank
finds: hora still initialized, a torch.distributed process group, CUDA initialized,
threads started by the call still alive (after a grace of :data:`THREAD_GRACE` s), other
signal handlers, another torch thread count, default dtype or grad mode, another working
directory, ``sys.path`` or root logging handlers, a newly imported framework of
:data:`FRAMEWORKS` (code that checks ``sys.modules`` must see what a fresh rank sees), or
more open file descriptors than before the call (on a process's first call, descriptors
the library keeps for the process's life are allowed: a fresh rank opens them too). When
in doubt it retires: a retired pool costs one fork per rank, as without a pool.

``TESTS_RANK_POOL=0`` turns the pool off (every call forks ranks of its own).

The processes are daemonic, exit when their pipe to the test process closes and are
killed when the fork server (which exits with the test process) dies, so nothing outlives
the session; :func:`shutdown` (registered with
``atexit``) retires the pool explicitly.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.connection as mpc
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hora.errors import WorkerFailedError

log = logging.getLogger(__name__)

SIZE = 2  #: the calls the pool serves have exactly this many ranks
THREAD_GRACE = 2.0  #: seconds a thread the call started may take to end after the call returned
STATE_TIMEOUT = 30.0  #: seconds to wait for a rank's report on what the call left behind
#: top-level modules whose presence in ``sys.modules`` the library or the tests branch on
#: (a rank that imported one is retired, so that the next call sees what a fresh rank
#: sees); other modules a call imports (torch's lazy imports: sympy, optree, ...) stay, as
#: a fresh rank would import them at the same point
FRAMEWORKS = frozenset({
    "tensorflow", "keras", "tf_keras", "lightning", "pytorch_lightning", "jax", "pyspark", "dask", "distributed",
    "ray", "IPython", "horovod", "mpi4py",
})


# ------------------------------------------------------------------ inside a pool rank
def _top_level_modules() -> set[str]:
    return {name.partition(".")[0] for name in list(sys.modules)}


def _signal_handlers() -> dict:
    handlers = {}
    for sig in signal.valid_signals():
        try:
            handlers[sig] = signal.getsignal(sig)
        except (ValueError, OSError):
            pass
    return handlers


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def _snapshot() -> dict:
    import torch

    root = logging.getLogger()
    return {
        "threads": {t.ident for t in threading.enumerate()},
        "signals": _signal_handlers(),
        "torch threads": torch.get_num_threads(),
        "default dtype": torch.get_default_dtype(),
        "grad mode": torch.is_grad_enabled(),
        "cwd": os.getcwd(),
        "sys.path": list(sys.path),
        "root handlers": list(root.handlers),
        "modules": _top_level_modules(),
        "fds": _open_fds(),
    }


def _left_behind(before: dict, first: bool) -> list[str]:
    """What the call changed that a later call could see (empty: the rank can be reused)."""
    import gc

    import torch

    from hora.native import state

    reasons = []
    if state.is_initialized():
        reasons.append("hora is still initialized")
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        reasons.append("a torch.distributed process group is still initialized")
    if torch.cuda.is_initialized():
        reasons.append("CUDA was initialized")
    deadline = time.monotonic() + THREAD_GRACE
    new = [t for t in threading.enumerate() if t.ident not in before["threads"]]
    for t in new:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in new if t.is_alive()]
    if alive:
        reasons.append(f"threads still alive: {alive}")
    gc.collect()  # objects the call dropped close their descriptors
    after = _snapshot()
    for key in ("signals", "torch threads", "default dtype", "grad mode", "cwd", "sys.path", "root handlers"):
        if after[key] != before[key]:
            reasons.append(f"{key} changed")
    new_frameworks = sorted((after["modules"] - before["modules"]) & FRAMEWORKS)
    if new_frameworks:
        reasons.append(f"imported {new_frameworks}")
    if not first and after["fds"] > before["fds"]:
        reasons.append(f"open file descriptors {before['fds']} -> {after['fds']}")
    return reasons


def _random_states() -> tuple:
    import random

    import numpy as np
    import torch

    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _set_random_states(states: tuple) -> None:
    import random

    import numpy as np
    import torch

    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])


def _pool_main(conn: mpc.Connection) -> None:
    """A pool rank's loop: one call per message until the pipe closes."""
    from hora.pids import die_with_parent

    die_with_parent()  # the fork server, which exits with the test process: no call outlives a killed session
    randoms = _random_states()  # the fork server's, as a fresh fork would start with
    first = True
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):  # the test process is gone or retired us
            os._exit(0)
        ok = False
        try:
            fn, env, args, kwargs = pickle.loads(data)
            # the caller's whole environment of this call: a variable it has since removed
            # must not reach the rank
            os.environ.clear()
            os.environ.update(env)
            _set_random_states(randoms)
            before = _snapshot()
            import hora

            hora._level_from_environment()  # the one setting read at import (by the fork server)
            value = fn(*args, **kwargs)
            # plain pickle, by value: tensors must not travel as shared-memory handles
            message = ("result", True, pickle.dumps(value))
            ok = True
        except BaseException as exc:  # report every failure, including SystemExit
            message = ("result", False, (repr(exc), traceback.format_exc()))
        conn.send(message)
        try:
            reasons = _left_behind(before, first) if ok else ["the call raised"]
        except BaseException as exc:
            reasons = [f"checking what the call left behind raised {exc!r}"]
        first = False
        conn.send(("state", reasons))


# ------------------------------------------------------------------ in the test process
def enabled() -> bool:
    """Whether run_ranks uses the pool: yes unless ``TESTS_RANK_POOL=0`` (to measure the
    suite without it, or to rule it out when a collective test misbehaves)."""
    return os.environ.get("TESTS_RANK_POOL", "1") != "0"


class _Rank:
    def __init__(self, proc: Any, conn: mpc.Connection):
        self.proc, self.conn = proc, conn

    @property
    def pid(self) -> int:
        return self.proc.pid


_ranks: list[_Rank] = []


def pids() -> list[int]:
    """The pool's process ids (empty when no pool is running)."""
    return [r.pid for r in _ranks]


def shutdown(reason: str = "the session ends") -> None:
    """Kill the pool's processes (the next call forks a fresh pair)."""
    global _ranks
    ranks, _ranks = _ranks, []
    if ranks:
        log.debug("retiring the rank pool %s: %s", [r.pid for r in ranks], reason)
    for r in ranks:
        r.conn.close()
        if r.proc.is_alive():
            r.proc.kill()
    for r in ranks:
        r.proc.join(timeout=5)


atexit.register(shutdown)


def _start(ctx: Any) -> list[_Rank]:
    if _ranks and not all(r.proc.is_alive() for r in _ranks):
        shutdown("a pool rank died between calls")
    if not _ranks:
        try:
            for _ in range(SIZE):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_pool_main, args=(child,), daemon=True, name="hora-test-pool-rank")
                proc.start()
                child.close()
                _ranks.append(_Rank(proc, parent))
        except BaseException:
            shutdown("a pool rank failed to start")
            raise
    return _ranks


def run(ctx: Any, fn: Callable[..., Any], envs: Sequence[Mapping[str, str]], args: tuple,
        kwargs: Mapping[str, Any], timeout: float) -> list[Any]:
    """Run one 2-rank call on the pool (started from ``ctx``, a forkserver context);
    results in rank order. Failures are raised as :func:`tests.spawn_util.run_ranks`
    raises them, after the pool is retired."""
    ranks = _start(ctx)
    reused = True
    try:
        for rank, r in enumerate(ranks):
            r.conn.send_bytes(pickle.dumps((fn, dict(envs[rank]), args, dict(kwargs))))
        out: dict[int, Any] = {}
        states: dict[int, list[str]] = {}
        deadline = time.monotonic() + timeout
        while len(states) < SIZE:
            now = time.monotonic()
            if len(out) < SIZE and now >= deadline:
                missing = sorted(set(range(SIZE)) - set(out))
                raise WorkerFailedError(f"ranks {missing} did not finish within {timeout:g}s")
            if len(out) == SIZE and now >= deadline + STATE_TIMEOUT:
                reused = False
                log.warning("rank pool: no report on what the call left behind within %gs", STATE_TIMEOUT)
                break
            waiting = {r.conn: rank for rank, r in enumerate(ranks) if rank not in states}
            ready = mpc.wait(list(waiting), timeout=min(0.5, max(0.01, deadline - now)) if len(out) < SIZE else 0.5)
            for conn in ready:
                rank = waiting[conn]
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    if rank in out:  # died after its result: keep the result, not the process
                        states[rank] = ["the rank died after its result"]
                        continue
                    proc = ranks[rank].proc
                    proc.join(timeout=5)
                    raise WorkerFailedError(
                        f"rank {rank} died with exit code {proc.exitcode}", rank=rank, exitcode=proc.exitcode
                    ) from None
                if message[0] == "result":
                    _, ok, value = message
                    if not ok:
                        raise WorkerFailedError(f"rank {rank} raised {value[0]}", rank=rank,
                                                remote_traceback=value[1])
                    out[rank] = pickle.loads(value)
                else:
                    states[rank] = message[1]
        left = {rank: reasons for rank, reasons in states.items() if reasons}
        if left:
            reused = False
            log.info("rank pool: retired after %s: %s", getattr(fn, "__qualname__", fn), left)
        return [out[r] for r in range(SIZE)]
    except BaseException:
        reused = False
        raise
    finally:
        if not reused:
            shutdown("the call failed or left state behind")
