"""Hosts and slots: ``-H host:slots,...``, host files, and which rank runs where.

Formats accepted (as horovodrun and mpirun):

* ``-H a:2,b:4`` (Horovod); a host without ``:slots`` has one slot.
* a host file, one host per line: ``a slots=2`` (Horovod, Open MPI; Open MPI's
  ``max_slots=`` is accepted and ignored), ``a:2`` (MPICH) or ``a`` (one slot);
  ``#`` starts a comment, blank lines are skipped.

Ranks fill the hosts in order (host 1's slots first), as Horovod assigns them, and
``local_rank`` / ``cross_rank`` follow from that. A host is *local* (its ranks start
without ssh) when it is ``localhost``, ``127.0.0.1``, ``::1``, this machine's hostname or
FQDN, or an address of one of this machine's interfaces; every other name, including
the loopback addresses ``127.0.0.2`` ... (which tests use to stand for a second
machine), is reached over ssh. Entries that name the same local machine are merged.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import socket
from collections.abc import Iterable, Sequence

from hora.errors import ConfigError
from hora.native.rendezvous import Placed, Placement, compute_placement

_LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost", "ip6-loopback"})
_HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+|[0-9A-Fa-f:]+)$")


@dataclasses.dataclass(frozen=True)
class HostSlots:
    """One host and how many ranks it may run.

    Attributes:
        name: the host as the user wrote it (an ssh destination: name, alias or address).
        slots: ranks it may run (>= 1).
    """

    name: str
    slots: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _HOST_RE.match(self.name):
            raise ConfigError(f"host name {self.name!r} is not a valid host name or address")
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 1:
            raise ConfigError(f"host {self.name!r}: slots must be an integer >= 1, got {self.slots!r}")

    @property
    def is_local(self) -> bool:
        """Whether this host is this machine (its ranks start without ssh)."""
        return is_local_host(self.name)


@dataclasses.dataclass(frozen=True)
class RankSlot(Placed):
    """Where one rank runs: its host and its place in the job (Horovod's SlotInfo;
    ``slot.rank``, ``slot.local_rank``, ... read its ``placement``)."""

    placement: Placement
    host: HostSlots


# ---------------------------------------------------------------------------------------
# parsing
# ---------------------------------------------------------------------------------------
def _parse_slots(text: str, where: str) -> int:
    try:
        slots = int(text)
    except ValueError:
        raise ConfigError(f"{where}: slots must be an integer, got {text!r}") from None
    if slots < 1:
        raise ConfigError(f"{where}: slots must be >= 1, got {slots}")
    return slots


def _host(name: str, slots: int, where: str) -> HostSlots:
    if not name:
        raise ConfigError(f"{where}: no host name")
    if not _HOST_RE.match(name):
        raise ConfigError(f"{where}: {name!r} is not a valid host name or address")
    return HostSlots(name.strip("[]") if name.startswith("[") else name, slots)


def _split_host_slots(item: str, where: str) -> HostSlots:
    """``host``, ``host:N``, ``[v6addr]:N`` or a bare IPv6 address."""
    if item.startswith("["):
        addr, sep, rest = item.partition("]")
        if not sep:
            raise ConfigError(f"{where}: {item!r} has an unclosed '['")
        slots = _parse_slots(rest[1:], where) if rest.startswith(":") else 1
        if rest and not rest.startswith(":"):
            raise ConfigError(f"{where}: {item!r} is not host:slots")
        return _host(addr + "]", slots, where)
    if item.count(":") > 1:  # a bare IPv6 address: no slots
        return _host(item, 1, where)
    name, sep, slots_s = item.partition(":")
    return _host(name, _parse_slots(slots_s, where) if sep else 1, where)


def parse_hosts(spec: str) -> list[HostSlots]:
    """Parse ``-H host1:slots,host2:slots`` (slots default to 1).

    Raises:
        ConfigError: an empty list or a malformed entry (named, with its position).
    """
    if not isinstance(spec, str):
        raise ConfigError(f"hosts must be a string like 'a:2,b:2', got {type(spec).__name__}")
    out = []
    items = [i.strip() for i in spec.split(",")]
    for n, item in enumerate(items, 1):
        if not item:
            if len(items) > 1:
                raise ConfigError(f"-H {spec!r}: entry {n} is empty")
            continue
        out.append(_split_host_slots(item, f"-H entry {n} {item!r}"))
    if not out:
        raise ConfigError("-H lists no hosts")
    return out


def parse_hostfile(path: str | os.PathLike) -> list[HostSlots]:
    """Read a host file (``host slots=N``, ``host:N`` or ``host`` per line, ``#`` comments).

    Raises:
        ConfigError: the file is missing or empty, or a line is malformed (named with its number).
    """
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"hostfile {path!r}: cannot read it: {exc.strerror or exc}") from None
    out = []
    for n, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"hostfile {path} line {n} {raw.strip()!r}"
        head, *fields = line.split()
        slots = None
        for field in fields:
            key, sep, value = field.partition("=")
            if not sep:
                raise ConfigError(f"{where}: expected 'host slots=N', got the field {field!r}")
            if key in ("slots", "slot"):
                slots = _parse_slots(value, where)
            elif key in ("max_slots", "max-slots"):
                _parse_slots(value, where)  # Open MPI's upper bound: hora runs at most `slots`
            else:
                raise ConfigError(f"{where}: unknown field {key!r} (use 'host slots=N')")
        host = _split_host_slots(head, where)
        if slots is not None:
            if ":" in head and not head.startswith("[") and head.count(":") == 1:
                raise ConfigError(f"{where}: slots given twice ('host:N' and 'slots=')")
            host = HostSlots(host.name, slots)
        out.append(host)
    if not out:
        raise ConfigError(f"hostfile {path!r} lists no hosts")
    return out


# ---------------------------------------------------------------------------------------
# this machine
# ---------------------------------------------------------------------------------------
def local_addresses() -> set[str]:
    """The IP addresses of this machine's interfaces (exactly, no whole loopback network)."""
    from hora.runners.network import interface_addresses

    out = {"127.0.0.1", "::1"}
    for addrs in interface_addresses().values():
        out.update(addrs)
    return out


def is_local_host(name: str) -> bool:
    """Whether ``name`` is this machine: see the module docstring for the rule."""
    if name in _LOCAL_NAMES:
        return True
    if name in {socket.gethostname(), socket.getfqdn()}:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False  # a name that is not this machine's: reached over ssh
    return name in local_addresses()


def merge_local(hosts: Iterable[HostSlots]) -> list[HostSlots]:
    """Merge entries that name this machine (``localhost:1,myname:1`` is one host with 2 slots)
    and repeated names, keeping the position of the first."""
    hosts = list(hosts)
    merged: dict[str, int] = {}
    for h in hosts:
        key = "localhost" if h.is_local else h.name
        merged[key] = merged.get(key, 0) + h.slots
    first_local = next((h.name for h in hosts if h.is_local), None)
    return [HostSlots(first_local if k == "localhost" and first_local else k, s) for k, s in merged.items()]


def assign_ranks(hosts: Sequence[HostSlots], num_proc: int) -> list[RankSlot]:
    """Give ranks 0..num_proc-1 to hosts in order, filling each host's slots first.

    Raises:
        ConfigError: ``num_proc`` exceeds the hosts' slots (both numbers named).
    """
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ConfigError(f"the number of ranks must be an int >= 1, got {num_proc!r}")
    total = sum(h.slots for h in hosts)
    if num_proc > total:
        listed = ",".join(f"{h.name}:{h.slots}" for h in hosts)
        raise ConfigError(f"-np {num_proc} needs {num_proc} slots but the hosts {listed!r} offer {total}")
    per_rank: list[HostSlots] = []
    for h in hosts:
        per_rank.extend([h] * min(h.slots, num_proc - len(per_rank)))
    placement: list[Placement] = compute_placement([h.name for h in per_rank])
    return [
        RankSlot(placement=p, host=per_rank[p.rank])
        for p in placement
    ]


def resolve_hosts(hosts: str | Sequence[HostSlots] | None, hostfile: str | os.PathLike | None,
                  num_proc: int) -> list[HostSlots]:
    """The host list of a run: ``hosts`` (``-H``), ``hostfile``, or ``localhost:num_proc``.

    Raises:
        ConfigError: both given, or either malformed.
    """
    if hosts is not None and hostfile is not None:
        raise ConfigError("give the hosts either as hosts (-H) or as a hostfile, not both")
    if hostfile is not None:
        parsed = parse_hostfile(hostfile)
    elif hosts is None:
        parsed = [HostSlots("localhost", num_proc)]
    elif isinstance(hosts, str):
        parsed = parse_hosts(hosts)
    else:
        parsed = list(hosts)
        for h in parsed:
            if not isinstance(h, HostSlots):
                raise ConfigError(f"hosts must be a 'host:slots,...' string or HostSlots, got {h!r}")
    return merge_local(parsed)


__all__ = ["HostSlots", "RankSlot", "parse_hosts", "parse_hostfile", "is_local_host", "local_addresses",
           "merge_local", "assign_ranks", "resolve_hosts"]
