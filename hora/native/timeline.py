"""Chrome-trace timeline of the engine's work.

Set ``HORA_TIMELINE=path.json`` (``hora run --timeline-filename``), or call
``hora.native.start_timeline(path)`` / ``stop_timeline()`` while the job runs, and rank 0
writes a trace that opens in chrome://tracing and Perfetto: one row per tensor name with
its phases ``NEGOTIATE`` (submitted until every rank agreed), ``QUEUE`` (agreed until its
collective starts), ``FUSE_COPY_IN`` / ``FUSE_COPY_OUT`` (fusion-buffer copies),
``COLLECTIVE`` (the backend call), and a ``NEGOTIATION_ROUND`` span per round on the
engine row; with ``HORA_TIMELINE_MARK_CYCLES=1`` (``mark_cycles=True``) also a
``CYCLE_START`` instant marker per round. ``summarize(path)`` turns a trace into a table
of time per phase.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import defaultdict
from typing import Any

from hora import settings
from hora.errors import ConfigError
from hora.settings import ENV_TIMELINE, ENV_TIMELINE_MARK_CYCLES

log = logging.getLogger(__name__)

ENV_TIMELINE_ALL_RANKS = "HORA_TIMELINE_ALL_RANKS"
PHASES = ("NEGOTIATE", "QUEUE", "FUSE_COPY_IN", "COLLECTIVE", "FUSE_COPY_OUT")
MAX_EVENTS = 2_000_000


def _now_us() -> float:
    return time.perf_counter_ns() / 1000.0


class Timeline:
    """Collects trace events in memory (bounded) and writes them as JSON on :meth:`close`.

    All methods are cheap no-ops when the timeline is disabled (``path`` is None).
    """

    def __init__(self, path: str | None, rank: int = 0, mark_cycles: bool = False) -> None:
        self.path = path
        self.enabled = path is not None
        self.rank = rank
        self.mark_cycles = mark_cycles
        self._events: list[dict[str, Any]] = []
        self._tids: dict[str, int] = {}
        self._lock = threading.Lock()
        self._dropped = 0
        self._t0 = _now_us()
        if self.enabled:
            self._meta("process_name", 0, {"name": f"hora rank {rank}"})
            self._meta("thread_name", 0, {"name": "engine"})

    @classmethod
    def from_environ(cls, rank: int) -> Timeline:
        """The timeline ``HORA_TIMELINE`` asks for (a disabled one without it)."""
        path = settings.get(ENV_TIMELINE) or None
        marks = settings.get(ENV_TIMELINE_MARK_CYCLES)
        return cls.for_rank(path, rank, mark_cycles=marks)

    @classmethod
    def for_rank(cls, path: str | None, rank: int, mark_cycles: bool = False) -> Timeline:
        """The timeline of ``rank`` for a job-wide ``path``: rank 0 writes ``path``; the
        others write ``path.rank<r>`` with ``HORA_TIMELINE_ALL_RANKS=1``, else nothing."""
        if path and rank != 0:
            if settings.get(ENV_TIMELINE_ALL_RANKS):
                path = f"{path}.rank{rank}"
            else:
                path = None
        return cls(path, rank, mark_cycles=mark_cycles)

    def now(self) -> float:
        return _now_us()

    def _meta(self, what: str, tid: int, args: dict[str, Any]) -> None:
        self._events.append({"name": what, "ph": "M", "pid": self.rank, "tid": tid, "args": args})

    def _tid(self, name: str) -> int:
        tid = self._tids.get(name)
        if tid is None:
            tid = self._tids[name] = len(self._tids) + 1
            self._meta("thread_name", tid, {"name": name})
        return tid

    def _add(self, event: dict[str, Any]) -> None:
        if len(self._events) >= MAX_EVENTS:
            self._dropped += 1
            return
        self._events.append(event)

    def span(self, tensor: str, phase: str, start_us: float, end_us: float, **args: Any) -> None:
        """Record ``phase`` of ``tensor`` from ``start_us`` to ``end_us`` (``now()`` units)."""
        if not self.enabled:
            return
        with self._lock:
            ev = {"name": phase, "ph": "X", "pid": self.rank, "tid": self._tid(tensor),
                  "ts": start_us - self._t0, "dur": max(0.0, end_us - start_us)}
            if args:
                ev["args"] = args
            self._add(ev)

    def cycle(self, start_us: float, end_us: float, **args: Any) -> None:
        """Record one negotiation round on the engine row."""
        if not self.enabled:
            return
        with self._lock:
            if self.mark_cycles:
                self._add({"name": "CYCLE_START", "ph": "i", "s": "t", "pid": self.rank, "tid": 0,
                           "ts": start_us - self._t0})
            self._add({"name": "NEGOTIATION_ROUND", "ph": "X", "pid": self.rank, "tid": 0,
                       "ts": start_us - self._t0, "dur": max(0.0, end_us - start_us), "args": args})

    def close(self) -> None:
        """Write the trace file (atomically). Safe to call twice."""
        if not self.enabled or self.path is None:
            return
        with self._lock:
            events, self._events = self._events, []
            path, self.path = self.path, None
        doc = {"traceEvents": events, "displayTimeUnit": "ms",
               "otherData": {"producer": "hora", "rank": self.rank, "dropped_events": self._dropped}}
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, path)
            log.info("timeline written to %s (%d events)", path, len(events))
        except OSError as exc:
            log.error("cannot write the timeline to %s: %s", path, exc)


def summarize(path: str) -> str:
    """Read a timeline written by hora and return a text table of time per phase.

    Columns: phase, count, total ms, mean us, max us; one row per phase plus the
    negotiation rounds.

    Raises:
        ConfigError: the file is missing or not a hora/Chrome trace.
    """
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"timeline file {path!r} does not exist") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"timeline file {path!r} is not valid JSON: {exc}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise ConfigError(f"timeline file {path!r} has no traceEvents list")
    stats: dict[str, list[float]] = defaultdict(list)
    tensors = set()
    for ev in events:
        if isinstance(ev, dict) and ev.get("ph") == "X":
            stats[ev.get("name", "?")].append(float(ev.get("dur", 0.0)))
            if ev.get("tid", 0) != 0:
                tensors.add((ev.get("pid"), ev.get("tid")))
    order = [p for p in PHASES if p in stats] + sorted(p for p in stats if p not in PHASES)
    rows = [("phase", "count", "total ms", "mean us", "max us")]
    for p in order:
        d = stats[p]
        rows.append((p, str(len(d)), f"{sum(d) / 1000:.3f}", f"{sum(d) / len(d):.1f}", f"{max(d):.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [f"timeline {path}: {len(tensors)} tensor rows, {sum(len(v) for v in stats.values())} spans"]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(r)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


__all__ = ["Timeline", "summarize", "PHASES", "ENV_TIMELINE", "ENV_TIMELINE_MARK_CYCLES"]
