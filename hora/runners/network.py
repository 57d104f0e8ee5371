"""This machine's network interfaces, and the address a job's services bind.

:func:`interface_addresses` lists every interface with its addresses (``getifaddrs``,
no third-party package). :func:`choose_service_address` picks the address the
launcher's rendezvous / driver service listens on: loopback when every host of the job
is this machine or a loopback address, else the address of ``--network-interface``,
the given ``--network-address`` (which must be this machine's), or the address the
kernel uses to reach the first remote host.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import socket
import sys
from collections.abc import Sequence

from hora.errors import ConfigError

_AF_INET, _AF_INET6 = socket.AF_INET, socket.AF_INET6


class _Sockaddr(ctypes.Structure):
    if sys.platform.startswith("linux"):
        _fields_ = [("sa_family", ctypes.c_ushort), ("sa_data", ctypes.c_byte * 14)]
    else:  # BSD layout (macOS)
        _fields_ = [("sa_len", ctypes.c_uint8), ("sa_family", ctypes.c_uint8), ("sa_data", ctypes.c_byte * 14)]


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [
    ("ifa_next", ctypes.POINTER(_Ifaddrs)),
    ("ifa_name", ctypes.c_char_p),
    ("ifa_flags", ctypes.c_uint),
    ("ifa_addr", ctypes.POINTER(_Sockaddr)),
    ("ifa_netmask", ctypes.POINTER(_Sockaddr)),
    ("ifa_ifu", ctypes.POINTER(_Sockaddr)),
    ("ifa_data", ctypes.c_void_p),
]


def interface_addresses() -> dict[str, list[str]]:
    """``{interface: [address, ...]}`` of this machine (IPv4 first, then IPv6).

    Returns an empty dict where ``getifaddrs`` is unavailable.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return {}
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        return {}
    out: dict[str, list[str]] = {}
    try:
        node = head
        while node:
            ifa = node.contents
            name = (ifa.ifa_name or b"").decode(errors="replace")
            if ifa.ifa_addr:
                family = ifa.ifa_addr.contents.sa_family
                raw = ctypes.string_at(ctypes.addressof(ifa.ifa_addr.contents), 28)
                addr = None
                if family == _AF_INET:
                    addr = socket.inet_ntop(_AF_INET, raw[4:8])
                elif family == _AF_INET6:
                    addr = socket.inet_ntop(_AF_INET6, raw[8:24])
                if addr is not None:
                    out.setdefault(name, []).append(addr)
            else:
                out.setdefault(name, [])
            node = ifa.ifa_next
    finally:
        libc.freeifaddrs(head)
    for name, addrs in out.items():
        addrs.sort(key=lambda a: (":" in a, a))
    return out


def interface_address(name: str) -> str:
    """The first (IPv4 if any) address of interface ``name`` on this machine.

    Raises:
        ConfigError: no such interface, or it has no address (the interfaces are listed).
    """
    table = interface_addresses()
    addrs = table.get(name)
    if addrs is None:
        raise ConfigError(f"network interface {name!r} does not exist on {socket.gethostname()} "
                          f"(its interfaces: {', '.join(sorted(table)) or 'none found'})")
    if not addrs:
        raise ConfigError(f"network interface {name!r} on {socket.gethostname()} has no IP address")
    return addrs[0]


def is_loopback(host: str) -> bool:
    """``localhost`` or an address in 127.0.0.0/8 or ``::1``."""
    if host in ("localhost", "ip6-localhost", "ip6-loopback"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve(host: str) -> str:
    """The IP address ``host`` resolves to here (IPv4 preferred); ``host`` itself if it is one.

    Raises:
        ConfigError: the name does not resolve.
    """
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"host {host!r} does not resolve to an address on this machine: {exc.strerror}") from None
    infos.sort(key=lambda i: i[0] != _AF_INET)
    return infos[0][4][0]


def route_source(remote: str) -> str:
    """The local address the kernel would use to reach ``remote`` (no packet is sent)."""
    family = _AF_INET6 if ":" in remote else _AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((remote, 9))
        except OSError as exc:
            raise ConfigError(f"no route from this machine to {remote}: {exc.strerror or exc}") from None
        return s.getsockname()[0]


def choose_service_address(remote_addresses: Sequence[str], *, interface: str | None = None,
                           address: str | None = None) -> str:
    """The address the launcher's services bind and advertise to every rank.

    Args:
        remote_addresses: the resolved addresses of the job's remote hosts.
        interface: ``--network-interface``: use this interface's address.
        address: ``--network-address``: use this address (must be this machine's).

    Raises:
        ConfigError: both given, no such interface, or an address that is not on this machine.
    """
    if interface and address:
        raise ConfigError("give either --network-interface or --network-address, not both")
    if interface:
        return interface_address(interface)
    if address:
        table = interface_addresses()
        mine = {a for addrs in table.values() for a in addrs}
        if address not in mine:
            raise ConfigError(f"--network-address {address} is not an address of this machine "
                              f"({socket.gethostname()} has {', '.join(sorted(mine)) or 'none'})")
        return address
    if all(is_loopback(a) for a in remote_addresses):
        return "127.0.0.1"
    return route_source(next(a for a in remote_addresses if not is_loopback(a)))


__all__ = ["interface_addresses", "interface_address", "is_loopback", "resolve", "route_source",
           "choose_service_address"]
