"""Hosts of an elastic run: the discovery script, the blacklist, and who runs which rank.

``--host-discovery-script S`` (horovodrun's): S prints the hosts that may run workers now,
one per line, ``host:slots`` or ``host`` (then ``--slots-per-host`` slots, default 1); blank
lines are skipped. hora runs it at start and then every second. At start any problem is
a :class:`~hora.errors.ConfigError` naming the script (it cannot run, exits non-zero,
prints a line that is not ``host[:slots]``: the line is quoted with its number); later a
failing run is logged and the hosts stay as they were (a transient failure, as Horovod).

:class:`HostManager` keeps the discovered hosts in a stable order (the oldest host first,
so ranks of surviving workers stay low and rank 0 is a survivor) without the hosts on
its blacklist: a host whose worker failed is blacklisted, for good, or with
``--blacklist-cooldown-range MIN MAX`` for a back-off that starts at MIN seconds and
doubles (plus jitter) up to MAX, after which it may come back (Horovod's rule).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence

from hora.errors import ConfigError
from hora.runners.slots import HostSlots, RankSlot, assign_ranks

log = logging.getLogger(__name__)

SCRIPT_TIMEOUT = 30.0  # seconds one run of the discovery script may take
COOLDOWN_BOUNDS = (1, 3600)  # seconds: the range --blacklist-cooldown-range must fit in (Horovod's)
ADDED, REMOVED = 1, 2  # update bits (hora.native.elastic.State.on_hosts_updated's convention)


class DiscoveryError(ConfigError):
    """The discovery script failed or printed something that is not ``host[:slots]``."""


class HostDiscoveryScript:
    """Runs the discovery script and parses its output.

    Args:
        script: the script (a path, or a command line: it is split as a shell would).
        slots_per_host: slots of a host printed without ``:slots`` (default 1).
        timeout: seconds one run may take.
    """

    def __init__(self, script: str, slots_per_host: int | None = None, timeout: float = SCRIPT_TIMEOUT) -> None:
        if not isinstance(script, str) or not script.strip():
            raise ConfigError("--host-discovery-script must name a script")
        if slots_per_host is not None and (isinstance(slots_per_host, bool) or not isinstance(slots_per_host, int)
                                           or slots_per_host < 1):
            raise ConfigError(f"--slots-per-host must be an integer >= 1, got {slots_per_host!r}")
        self.script = script
        self.argv = shlex.split(script)
        self.slots_per_host = slots_per_host or 1
        self.timeout = timeout

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        """``{host: slots}`` as the script prints them now (Horovod's method name).

        Raises:
            DiscoveryError: the script cannot run, times out, exits non-zero, or prints a
                line that is not ``host[:slots]`` (the message names the script and the line).
        """
        try:
            done = subprocess.run(self.argv, capture_output=True, text=True, timeout=self.timeout, check=False)
        except FileNotFoundError:
            raise DiscoveryError(f"host discovery script {self.script!r} was not found") from None
        except PermissionError:
            raise DiscoveryError(f"host discovery script {self.script!r} is not executable (chmod +x it)") from None
        except subprocess.TimeoutExpired:
            raise DiscoveryError(f"host discovery script {self.script!r} did not finish within "
                                 f"{self.timeout:g}s") from None
        except OSError as exc:
            raise DiscoveryError(f"host discovery script {self.script!r} cannot run: {exc}") from None
        if done.returncode != 0:
            tail = " / ".join(ln for ln in done.stderr.strip().splitlines()[-3:]) or "no output on stderr"
            raise DiscoveryError(f"host discovery script {self.script!r} failed with exit code {done.returncode}: "
                                 f"{tail}")
        return parse_discovery_output(done.stdout, self.script, self.slots_per_host)


def parse_discovery_output(text: str, script: str, slots_per_host: int = 1) -> dict[str, int]:
    """``{host: slots}`` from a discovery script's output (a host printed twice keeps its last slots).

    Raises:
        DiscoveryError: a line that is not ``host`` or ``host:slots`` with slots >= 1.
    """
    out: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        name, sep, slots_s = line.partition(":")
        where = f"host discovery script {script!r}, output line {number} {raw!r}"
        if sep and not slots_s.strip().isdigit():
            raise DiscoveryError(f"{where}: expected 'host' or 'host:slots' with an integer slots count")
        try:
            host = HostSlots(name.strip(), int(slots_s) if sep else slots_per_host)
        except ConfigError as exc:
            raise DiscoveryError(f"{where}: {exc}") from None
        out[host.name] = host.slots
    return out


def check_cooldown_range(cooldown: Sequence[int] | None) -> tuple[int, int] | None:
    """``(min, max)`` seconds of ``--blacklist-cooldown-range``, or None.

    Raises:
        ConfigError: not two integers with 1 <= min <= max <= 3600.
    """
    if cooldown is None:
        return None
    low, high = tuple(cooldown)
    lo_bound, hi_bound = COOLDOWN_BOUNDS
    if not (isinstance(low, int) and isinstance(high, int) and lo_bound <= low <= high <= hi_bound):
        raise ConfigError(f"--blacklist-cooldown-range {low} {high}: need {lo_bound} <= MIN <= MAX <= {hi_bound} "
                          "seconds")
    return low, high


@dataclasses.dataclass
class _HostState:
    blacklisted: bool = False
    count: int = 0
    cooldown_until: float = 0.0


class HostManager:
    """The discovered hosts, in assignment order, without blacklisted ones (module docstring).

    Args:
        discover: returns ``{host: slots}`` (a :class:`HostDiscoveryScript`'s method).
        cooldown_range: ``(min, max)`` seconds a failing host stays blacklisted; None: for good.
        clock: the time source (tests pass a fake one).
    """

    def __init__(self, discover: Callable[[], dict[str, int]], cooldown_range: tuple[int, int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._discover = discover
        self._cooldown = check_cooldown_range(cooldown_range)
        self._clock = clock
        self._slots: dict[str, int] = {}
        self._order: list[str] = []
        self._states: dict[str, _HostState] = {}

    def _state(self, host: str) -> _HostState:
        return self._states.setdefault(host, _HostState())

    def _available(self, host: str) -> bool:
        st = self._state(host)
        if st.blacklisted and self._cooldown is not None and self._clock() >= st.cooldown_until:
            st.blacklisted = False  # its cooldown is over: it may run workers again
            log.info("host %s leaves the blacklist (its cooldown ended)", host)
        return not st.blacklisted

    def update(self) -> int:
        """Run the discovery; return the change of the usable slots (``ADDED | REMOVED`` bits, 0: none).

        Raises:
            DiscoveryError: the discovery script failed (see :class:`HostDiscoveryScript`).
        """
        before = self.hosts()
        found = self._discover()
        self._slots = dict(found)
        self._order = [h for h in self._order if h in found] + [h for h in found if h not in self._order]
        after = self.hosts()
        res = 0
        for host, slots in before.items():
            if after.get(host, 0) < slots:
                res |= REMOVED
        for host, slots in after.items():
            if slots > before.get(host, 0):
                res |= ADDED
        return res

    def hosts(self) -> dict[str, int]:
        """``{host: slots}`` of the usable hosts, in assignment order."""
        return {h: self._slots[h] for h in self._order if self._available(h)}

    def slots(self) -> int:
        """How many workers the usable hosts can run."""
        return sum(self.hosts().values())

    def blacklist(self, host: str) -> None:
        """Stop using ``host`` (for good, or for a cooldown that grows with each blacklisting)."""
        st = self._state(host)
        st.blacklisted = True
        st.count += 1
        if self._cooldown is not None:
            low, high = self._cooldown
            delay = max(low, min(high, low * (1 << st.count) + random.uniform(0, 1) * low))
            st.cooldown_until = self._clock() + delay
            log.warning("host %s is blacklisted for %.0fs (its worker failed)", host, delay)
        else:
            log.warning("host %s is blacklisted (its worker failed)", host)

    def is_blacklisted(self, host: str) -> bool:
        return not self._available(host)


def assign(hosts: dict[str, int], min_np: int, max_np: int | None, first: Sequence[str] = ()) -> list[RankSlot]:
    """The ranks of a round: up to ``max_np`` slots of ``hosts`` (in order, hosts named in
    ``first`` before the others), Horovod's ``get_host_assignments``.

    Raises:
        ConfigError: fewer than ``min_np`` slots.
    """
    order = [h for h in first if h in hosts] + [h for h in hosts if h not in first]
    total = sum(hosts.values())
    if total < min_np:
        raise ConfigError(f"{total} slot(s) on the available hosts ({_describe(hosts)}), fewer than --min-np {min_np}")
    n = total if max_np is None else min(total, max_np)
    return assign_ranks([HostSlots(h, hosts[h]) for h in order], n)


def _describe(hosts: dict[str, int]) -> str:
    return ", ".join(f"{h}:{s}" for h, s in hosts.items()) or "none"


__all__ = ["HostDiscoveryScript", "HostManager", "DiscoveryError", "parse_discovery_output", "check_cooldown_range",
           "assign", "ADDED", "REMOVED"]
