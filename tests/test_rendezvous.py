"""The rendezvous key-value store: contract, authentication, robustness, timeouts."""

from __future__ import annotations

import hashlib
import hmac
import logging
import pickle
import socket
import struct
import threading
import time

import pytest

from hora.errors import ConfigError, RendezvousError
from hora.native.rendezvous import (
    KVClient,
    Placement,
    RendezvousServer,
    WorkerEnv,
    barrier,
    compute_placement,
    make_secret,
)
from hora.native.rendezvous.protocol import HEADER, MAGIC, AuthenticationError, recv_frame, sign

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def server():
    srv = RendezvousServer(make_secret(), host="127.0.0.1")
    srv.start()
    yield srv
    srv.stop()


def _client(srv: RendezvousServer, secret: bytes | None = None, timeout: float = 5.0) -> KVClient:
    return KVClient(srv.addr, secret if secret is not None else srv._secret, timeout=timeout)


def test_set_get_add_keys_delete(server):
    c = _client(server)
    c.set("a/1", b"one")
    assert c.get("a/1") == b"one"
    assert c.add("counter") == 1
    assert c.add("counter", 5) == 6
    assert c.keys("a/") == ["a/1"]
    assert c.delete("a/1") is True
    assert c.keys("a/") == []
    assert server.keys("counter") == ["counter"]


def test_get_blocks_until_another_client_sets(server):
    c1, c2 = _client(server), _client(server)
    threading.Timer(0.3, lambda: c2.set("late", b"x")).start()
    assert c1.get("late", timeout=5) == b"x"


def test_wait_timeout_names_missing_keys(server):
    c = _client(server)
    c.set("k0", b"")
    with pytest.raises(RendezvousError, match="k1"):
        c.wait(["k0", "k1"], timeout=0.5)


def test_barrier_names_missing_ranks(server):
    c = _client(server)
    with pytest.raises(RendezvousError, match=r"\[1, 2\] never arrived"):
        barrier(c, "start", rank=0, size=3, timeout=0.5)


def test_barrier_passes_when_all_arrive(server):
    clients = [_client(server) for _ in range(3)]
    threads = [threading.Thread(target=barrier, args=(c, "b", r, 3, 5)) for r, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sorted(server.keys("barrier/b/")) == ["barrier/b/0", "barrier/b/1", "barrier/b/2"]


def test_wrong_secret_is_rejected_and_logged(server, caplog):
    bad = _client(server, secret=b"not-the-secret", timeout=2)
    with caplog.at_level(logging.WARNING, logger="hora.native.rendezvous"):
        with pytest.raises(RendezvousError):
            bad.set("evil", b"1")
    assert "HMAC" in caplog.text
    # the server is still healthy and nothing was written
    good = _client(server)
    assert good.ping()
    assert good.keys("evil") == []


class _Boom:
    def __reduce__(self):  # would run on unpickle if the server unpickled before checking
        return (_explode, ())


_EXPLODED = []


def _explode():
    _EXPLODED.append(True)
    return "boom"


def test_forged_frame_is_never_unpickled(server):
    body = pickle.dumps(("set", "forged", _Boom()))
    mac = hmac.new(b"attacker-guess", body, hashlib.sha256).digest()
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(struct.pack("!4sI32s", MAGIC, len(body), mac) + body)
        s.settimeout(5)
        assert s.recv(1) == b""  # dropped
    assert _EXPLODED == []
    assert _client(server).keys("forged") == []


def test_a_peer_of_another_protocol_version_is_refused_by_both_ends(server, caplog):
    body = pickle.dumps(("get", "k"))
    secret = server._secret
    # the server: a signed frame under version 1's magic is dropped, and the log names both versions
    with caplog.at_level(logging.WARNING, logger="hora.native.rendezvous"):
        with socket.create_connection(server.address, timeout=5) as s:
            s.sendall(HEADER.pack(b"HORA", len(body), sign(secret, body)) + body)
            s.settimeout(5)
            assert s.recv(1) == b""
    assert "version 1, this end version 2" in caplog.text
    # the client: an answer under another version's magic is an error naming it, never unpickled
    for magic in (b"HOR3", MAGIC):
        a, b = socket.socketpair()
        with a, b:
            b.sendall(HEADER.pack(magic, len(body), sign(secret, body)) + body)
            if magic == MAGIC:
                assert recv_frame(a, secret) == ("get", "k")
            else:
                with pytest.raises(AuthenticationError, match="version 3, this end version 2"):
                    recv_frame(a, secret)


@pytest.mark.parametrize(
    "garbage",
    [b"GET / HTTP/1.1\r\n\r\n", b"\x00" * 3, b"HOR2" + struct.pack("!I", 2**31) + b"\x00" * 32, b""],
)
def test_garbage_does_not_crash_the_server(server, garbage):
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(garbage)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(5)
        s.recv(1)
    assert _client(server).ping()


def test_unreachable_server_is_a_clear_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    c = KVClient(f"127.0.0.1:{port}", make_secret(), timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(RendezvousError, match="cannot reach"):
        c.ping()
    assert time.monotonic() - t0 < 10


def test_worker_env_round_trip_and_errors():
    env = WorkerEnv(
        Placement(rank=1, size=2, local_rank=1, local_size=2, cross_rank=0, cross_size=1, host="127.0.0.1"),
        rendezvous_addr="127.0.0.1:1234", secret=b"\x01\x02", job_id="j",
    )
    assert WorkerEnv.from_environ(env.to_environ()) == env
    assert "secret" not in repr(env).lower() or "\\x01" not in repr(env)
    with pytest.raises(ConfigError, match="HORA_RANK"):
        WorkerEnv.from_environ({})
    bad = env.to_environ() | {"HORA_BACKEND": "carrier-pigeon"}
    with pytest.raises(ConfigError, match="carrier-pigeon"):
        WorkerEnv.from_environ(bad)
    with pytest.raises(ConfigError, match="outside"):
        WorkerEnv.from_environ(env.to_environ() | {"HORA_RANK": "2"})


def test_compute_placement_like_horovod():
    hosts = ["a", "a", "b", "a", "b"]
    p = compute_placement(hosts)
    assert [(x.local_rank, x.local_size) for x in p] == [(0, 3), (1, 3), (0, 2), (2, 3), (1, 2)]
    # cross rank: index of the host among hosts having that local rank
    assert [(x.cross_rank, x.cross_size) for x in p] == [(0, 2), (0, 2), (1, 2), (0, 1), (1, 2)]
