"""Stall inspection: ops some ranks submitted and others never did.

After ``HORA_STALL_CHECK_TIME`` such an op is logged (``stall: ...``, once, naming the
ranks on each side); after ``HORA_STALL_SHUTDOWN_TIME`` (default 0: never, as in
Horovod; the caller's ``synchronize`` still times out after ``HORA_OP_TIMEOUT``) it fails with a :class:`~hora.errors.CollectiveError` on the ranks that
submitted it, naming those that never did, and it is *poisoned* for the late ranks:
when they submit it after all, it fails at once for them too (their peers have moved
on). Cached ops stuck half-submitted are dropped from the cache after half the check
time, so that they are renegotiated by name, which tells exactly who is missing.

Runs inside the round, on every rank alike (the clock is the round's job-wide one).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable

from hora.native.engine.cache import ResponseCache
from hora.native.engine.config import ENV_STALL_CHECK_TIME, ENV_STALL_SHUTDOWN_TIME, EngineConfig
from hora.native.engine.negotiation import Negotiator

log = logging.getLogger(__name__)


class StallInspector:
    """Tracks how long cached slots have been half-submitted, and runs the checks."""

    def __init__(self, config: EngineConfig, negotiator: Negotiator, cache: ResponseCache,
                 stats: collections.Counter) -> None:
        self.warn_after = config.stall_check_time
        self.fail_after = config.stall_shutdown_time
        enabled = [t for t in (self.warn_after, self.fail_after) if t > 0]
        self.enabled = bool(enabled)
        self.renegotiate_after_ms = min(enabled, default=0.0) * 500  # half the shortest, in ms
        self.negotiator = negotiator
        self.cache = cache
        self.partial_since: dict[int, int] = {}  # cache slot -> job clock (ms) it was first seen half-submitted
        self.stats = stats

    def check(self, now: int, partial: Iterable[int], errors: dict[str, str]) -> None:
        """One round's checks at job clock ``now`` (ms); ``partial``: the cached slots some
        rank but not every rank has submitted. Adds this rank's failures to ``errors``."""
        if not self.enabled:
            return
        cache = self.cache
        seen = set()
        for s in partial:
            s = int(s)
            seen.add(s)
            since = self.partial_since.setdefault(s, now)
            if now - since > self.renegotiate_after_ms:
                e = cache.slots[s]
                if e is not None:
                    cache.erase(e.name)
                self.partial_since.pop(s, None)
        for s in list(self.partial_since):
            if s not in seen:
                del self.partial_since[s]
        neg = self.negotiator
        table = neg.table
        if not table:
            return
        for p in list(table.values()):
            age = (now - p.first) / 1000.0
            if self.warn_after > 0 and age > self.warn_after and not p.warned:
                p.warned = True
                kind = next(iter(p.keys.values())).kind
                log.warning(
                    "stall: %s '%s' was submitted by ranks %s but not by ranks %s for %.1fs (%s=%g; it fails "
                    "after %s=%g)", kind, p.name, sorted(p.keys), neg.missing_ranks(p), age,
                    ENV_STALL_CHECK_TIME, self.warn_after, ENV_STALL_SHUTDOWN_TIME, self.fail_after,
                )
                self.stats["stall_warnings"] += 1
            if self.fail_after > 0 and age > self.fail_after:
                missing = neg.missing_ranks(p)
                kind = next(iter(p.keys.values())).kind
                msg = (f"stalled collective: {kind} '{p.name}' was submitted by ranks {sorted(p.keys)} but "
                       f"ranks {missing} never submitted it within {ENV_STALL_SHUTDOWN_TIME}={self.fail_after:g}s")
                del table[p.name]
                if neg.rank in p.keys:
                    errors[p.name] = msg
                if missing:
                    neg.poisoned[p.name] = (msg, set(missing))

    @property
    def tracking(self) -> bool:
        """Whether a half-submitted cached slot is being timed (job-wide state)."""
        return bool(self.partial_since)
