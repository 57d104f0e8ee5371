"""The engine's configuration: a frozen dataclass read from the ``HORA_*`` settings.

Nothing changes it after start-up: the autotuner proposes values and the engine applies
them to its own :class:`Tuning` (see :mod:`hora.native.engine.autotune`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hora import settings
from hora.errors import ConfigError
from hora.settings import ENV_AUTOTUNE, ENV_CACHE_CAPACITY, ENV_CYCLE_TIME, ENV_FUSION_THRESHOLD

ENV_STALL_CHECK_TIME = "HORA_STALL_CHECK_TIME"
ENV_STALL_SHUTDOWN_TIME = "HORA_STALL_SHUTDOWN_TIME"
ENV_OP_TIMEOUT = "HORA_OP_TIMEOUT"
ENV_AUTOTUNE_WINDOW = "HORA_AUTOTUNE_WINDOW"
ENV_SHUTDOWN_TIMEOUT = "HORA_SHUTDOWN_TIMEOUT"
ENV_LINGER_ROUNDS = "HORA_LINGER_ROUNDS"
ENV_SPECULATE = "HORA_SPECULATE"

IDLE_POLL = 60.0  # seconds an idle thread blocks before re-checking (shutdown wakes it at once)
MIN_STALL_POLL = 0.05  # seconds: the fastest a blocked caller re-runs the stall checks
ABORT_JOIN_TIMEOUT = 5.0  # seconds shutdown waits for an interrupted engine thread before leaving it


@dataclass(frozen=True)
class EngineConfig:
    """Tunables of the engine; every field defaults to its ``HORA_*`` setting.

    ``cycle_time`` is in seconds (``HORA_CYCLE_TIME`` is in milliseconds). Zero turns off
    fusion (``fusion_threshold``), the response cache (``cache_capacity``), stall
    warnings (``stall_check_time``) and stall failures (``stall_shutdown_time``).

    Raises:
        ConfigError: a setting is malformed or outside its bounds (named with its value).
    """

    cycle_time: float = field(default_factory=lambda: settings.get(ENV_CYCLE_TIME) / 1000.0)
    fusion_threshold: int = field(default_factory=lambda: settings.get(ENV_FUSION_THRESHOLD))
    cache_capacity: int = field(default_factory=lambda: settings.get(ENV_CACHE_CAPACITY))
    stall_check_time: float = field(default_factory=lambda: settings.get(ENV_STALL_CHECK_TIME))
    # Horovod's HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: off by default (a caller's
    # synchronize still fails after op_timeout, naming the ranks that never submitted)
    stall_shutdown_time: float = field(default_factory=lambda: settings.get(ENV_STALL_SHUTDOWN_TIME))
    op_timeout: float = field(default_factory=lambda: settings.get(ENV_OP_TIMEOUT))
    shutdown_timeout: float = field(default_factory=lambda: settings.get(ENV_SHUTDOWN_TIMEOUT))
    autotune: bool = field(default_factory=lambda: settings.get(ENV_AUTOTUNE))
    autotune_window: int = field(default_factory=lambda: settings.get(ENV_AUTOTUNE_WINDOW))
    # rounds without results the engine runs (one per cycle) before it goes idle; 0 (the
    # default): idle after every round, so every round starts from a wake-up through the
    # store, which costs less than one more collective round (job-wide)
    linger_rounds: int = field(default_factory=lambda: settings.get(ENV_LINGER_ROUNDS))
    # predicted rounds carry their data in the negotiation's collective (speculation.py)
    speculate: bool = field(default_factory=lambda: settings.get(ENV_SPECULATE))

    def __post_init__(self) -> None:
        checks = (
            ("cycle_time", self.cycle_time >= 0), ("fusion_threshold", self.fusion_threshold >= 0),
            ("cache_capacity", self.cache_capacity >= 0), ("stall_check_time", self.stall_check_time >= 0),
            ("stall_shutdown_time", self.stall_shutdown_time >= 0), ("op_timeout", self.op_timeout > 0),
            ("shutdown_timeout", self.shutdown_timeout > 0), ("autotune_window", self.autotune_window >= 1),
            ("linger_rounds", self.linger_rounds >= 0),
        )
        bad = [name for name, ok in checks if not ok]
        if bad:
            raise ConfigError(f"EngineConfig: {', '.join(f'{n}={getattr(self, n)!r}' for n in bad)} out of range "
                              "(times and sizes are >= 0; op_timeout, shutdown_timeout > 0; autotune_window >= 1)")

    @property
    def stall_poll(self) -> float | None:
        """Seconds between the wake-ups a blocked caller sends so that idle engines run
        the stall checks; None when neither stall warnings nor stall failures are on."""
        times = [t for t in (self.stall_check_time, self.stall_shutdown_time) if t > 0]
        if not times:
            return None
        return min(IDLE_POLL, max(MIN_STALL_POLL, min(times) / 4))

    def replace(self, **changes: object) -> EngineConfig:
        """A copy with ``changes`` (the config itself never changes)."""
        return dataclasses.replace(self, **changes)


@dataclass
class Tuning:
    """The values of the tunables the engine runs with now: the config's, until the
    autotuner (rank 0's proposal, applied alike on every rank) changes them."""

    fusion_threshold: int
    cycle_time: float

    @classmethod
    def of(cls, config: EngineConfig) -> Tuning:
        return cls(config.fusion_threshold, config.cycle_time)
