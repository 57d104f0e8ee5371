"""Run a function on N real processes over loopback, the way a launcher would.

Used by the collective tests before (and independently of) the runners: each rank is a
real process with the ``HORA_*`` environment of a real job and a real
:class:`~hora.native.rendezvous.RendezvousServer`. ``fn`` must be importable (defined at
module level). Results come back in rank order; the first failure is raised with the
remote traceback; nothing outlives the call.

Ranks start warm: they are forked from one ``multiprocessing`` fork server per test
session that has already imported torch, numpy and ``hora.native`` (:data:`PRELOAD`), so
a rank costs a fork instead of an interpreter start and an import of torch (2-3 s of CPU
each). Nothing in those modules reads the job's settings at import time except
``HORA_LOG_LEVEL`` (``import hora``), which each rank applies again; every other
``HORA_*`` setting is read by ``init``, after the rank's environment is in place. Each
rank's environment is the caller's environment at the time of the call plus the job's
variables, as with a spawned process (not the fork server's, which is the caller's at the
time the server started). ``fresh=True`` starts ranks as new ``spawn`` interpreters
instead, for a test that needs a pristine one (a module's import-time behaviour under an
environment the fork server did not have).

``preload=("tensorflow",)`` asks for a server that has imported those modules too (TF's
import is 6 s of CPU per rank). A server holds exactly the modules of the call it serves:
when a call asks for another list the server is restarted, so the ranks of torch-only
tests never have TensorFlow imported (code that checks ``sys.modules`` behaves as in a
real rank).

Calls of 2 ranks are served by a pool of 2 warm processes that live for the whole session
(:mod:`tests.rank_pool`): each call still gets its own rendezvous server and environment,
and the pool is retired (a fresh pair forked on the next call) after a call that failed
or left anything behind that a later test could see. ``pool=False`` (or ``fresh=True``,
or another ``preload``) gives the call ranks of its own, as a test that kills, stops or
crashes ranks needs.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.forkserver as forkserver
import os
import pickle
import queue
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from hora.errors import WorkerFailedError
from hora.native.rendezvous import RendezvousServer, WorkerEnv, make_secret
from tests import rank_pool

#: what the fork server imports once (``__main__``: the test runner's script, which each
#: rank would otherwise import again); a module that fails to import is skipped by it
PRELOAD = (
    "__main__", "numpy", "torch", "hora", "hora.native", "hora.torch",
    "tests.native.workers", "tests.native.lifecycle_workers", "tests.torch.workers",
    "tests.torch.horovod_api_workers",
)


_server_preload: list[str] | None = None  # what the running fork server imported


def _context(fresh: bool, preload: tuple[str, ...]) -> Any:
    global _server_preload
    if fresh:
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    wanted = list(dict.fromkeys(PRELOAD + tuple(preload)))
    if _server_preload is not None and wanted != _server_preload:
        # another list: stop the server (it exits when its last client closes), the next
        # Process.start() starts one that imports exactly ``wanted``; the pool's ranks go
        # first (they came from the old server, which reports their exit)
        rank_pool.shutdown("the fork server restarts with another preload")
        forkserver._forkserver._stop()
    ctx.set_forkserver_preload(wanted)  # used when the server starts
    _server_preload = wanted
    return ctx


def _child(fn, rank, env, args, kwargs, results):
    # the caller's whole environment, not the fork server's: a variable the caller has
    # since removed must not reach the rank
    os.environ.clear()
    os.environ.update(env)
    try:
        import hora

        hora._level_from_environment()  # the one setting read at import (by the fork server)
        value = fn(*args, **kwargs)
        # plain pickle, by value: a multiprocessing queue would send torch tensors as
        # shared-memory handles that die with this process
        results.put((rank, True, pickle.dumps(value)))
    except BaseException as exc:  # report every failure, including SystemExit
        results.put((rank, False, (repr(exc), traceback.format_exc())))


def run_ranks(
    fn: Callable[..., Any],
    size: int,
    *,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    rank_env: Mapping[int, Mapping[str, str]] | None = None,
    timeout: float = 60.0,
    backend: str = "gloo",
    fresh: bool = False,
    preload: tuple[str, ...] = (),
    pool: bool = True,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``size`` processes; return results in rank order.

    Ranks are forked from the warm fork server (which has also imported ``preload``), or
    spawned as new interpreters when ``fresh`` (see the module's docstring); a call of 2
    ranks runs on the session's pool of warm ranks unless ``pool`` is false, ``fresh`` is
    set or ``preload`` is given.

    Raises:
        WorkerFailedError: a rank raised (carries its traceback) or died, or the job
            exceeded ``timeout`` seconds (naming the ranks that never finished).
    """
    ctx = _context(fresh, preload)
    secret = make_secret()
    # a job id of its own: a pooled rank (tests/rank_pool.py) that joined earlier jobs in the same
    # process meets this one's ranks as a fresh process would (the engine keeps the generations a
    # process joined per job id)
    job_id = f"test-{os.urandom(4).hex()}"
    server = RendezvousServer(secret, host="127.0.0.1")
    server.start()
    pooled = pool and not fresh and not preload and size == rank_pool.SIZE and rank_pool.enabled()
    results = None if pooled else ctx.Queue()
    procs = []
    try:
        envs = []
        for rank in range(size):
            wenv = dict(os.environ)
            wenv.update(WorkerEnv.local(rank, size, server.addr, secret, job_id=job_id, backend=backend,
                                        start_timeout=min(timeout, 60.0)).to_environ())
            wenv.update({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
            wenv.update(env or {})
            wenv.update((rank_env or {}).get(rank, {}))
            envs.append(wenv)
        if pooled:
            return rank_pool.run(ctx, fn, envs, args, dict(kwargs or {}), timeout)
        for rank, wenv in enumerate(envs):
            p = ctx.Process(target=_child, args=(fn, rank, wenv, args, dict(kwargs or {}), results), daemon=True)
            p.start()
            procs.append(p)
        out: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(out) < size:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(size)) - set(out))
                raise WorkerFailedError(f"ranks {missing} did not finish within {timeout:g}s")
            try:
                rank, ok, value = results.get(timeout=min(left, 0.5))
            except queue.Empty:
                for r, p in enumerate(procs):
                    if r not in out and not p.is_alive() and p.exitcode not in (0, None):
                        # give a queued result a moment to arrive before declaring death
                        try:
                            rank, ok, value = results.get(timeout=1.0)
                            break
                        except queue.Empty:
                            raise WorkerFailedError(
                                f"rank {r} died with exit code {p.exitcode}", rank=r, exitcode=p.exitcode
                            ) from None
                else:
                    continue
            if not ok:
                raise WorkerFailedError(f"rank {rank} raised {value[0]}", rank=rank, remote_traceback=value[1])
            out[rank] = pickle.loads(value)
        return [out[r] for r in range(size)]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=5)
        server.stop()
