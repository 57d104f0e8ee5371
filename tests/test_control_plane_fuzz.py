"""The parsers that read bytes from another process or host, under arbitrary input
(property-based, a bounded number of examples so CI stays quick):

- the signed frames of the rendezvous server (which the driver service also is),
- the warm server's JSON requests, and its socket against a second local user,
- the Store channel's signed files.

Any byte string is parsed or rejected with the module's typed error, never hangs, and
nothing is unpickled before its HMAC checks out.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pickle
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hora.errors import StoreError
from hora.native import rendezvous as rdv
from hora.native.rendezvous import protocol as wire
from hora.runners.driver import store_channel
from hora.runners.rank.warm import client as warm
from hora.runners.rank.warm import server as warm_server

pytestmark = pytest.mark.timeout(120)
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SECRET = b"s" * 32


class _Loads:
    """Stands in for the pickle module inside a parser: records every ``loads``."""

    def __init__(self) -> None:
        self.calls = 0
        self.UnpicklingError = pickle.UnpicklingError
        self.HIGHEST_PROTOCOL = pickle.HIGHEST_PROTOCOL
        self.dumps = pickle.dumps

    def loads(self, data: bytes) -> object:
        self.calls += 1
        return pickle.loads(data)


def _feed(data: bytes, frame_timeout: float | None = None) -> object:
    """Parse ``data`` as one frame from a socket whose peer wrote it and closed."""
    a, b = socket.socketpair()
    try:
        b.settimeout(5.0)
        writer = threading.Thread(target=lambda: (a.sendall(data), a.shutdown(socket.SHUT_WR)), daemon=True)
        writer.start()
        try:
            return wire.recv_frame(b, SECRET, frame_timeout)
        finally:
            writer.join(5)
    finally:
        a.close()
        b.close()


@FUZZ
@given(data=st.binary(max_size=600))
def test_any_bytes_are_a_typed_rejection_and_never_unpickled(data, monkeypatch):
    spy = _Loads()
    monkeypatch.setattr(wire, "pickle", spy)
    with pytest.raises(rdv.RendezvousError) as info:
        _feed(data)
    assert isinstance(info.value, (rdv.FrameError, rdv.PeerClosedError))
    assert spy.calls == 0


@FUZZ
@given(body=st.binary(max_size=400), mac=st.binary(min_size=32, max_size=32), extra=st.binary(max_size=40))
def test_a_well_formed_frame_with_a_wrong_mac_is_never_unpickled(body, mac, extra, monkeypatch):
    spy = _Loads()
    monkeypatch.setattr(wire, "pickle", spy)
    frame = wire.HEADER.pack(wire.MAGIC, len(body), mac) + body + extra
    with pytest.raises(rdv.AuthenticationError):
        _feed(frame)
    assert spy.calls == 0


@FUZZ
@given(obj=st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20) | st.binary(max_size=20),
                        lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner), max_leaves=12))
def test_a_signed_frame_round_trips(obj):
    a, b = socket.socketpair()
    try:
        wire.send_frame(a, SECRET, obj)
        assert wire.recv_frame(b, SECRET, 5.0) == obj
    finally:
        a.close()
        b.close()


def test_a_stalled_frame_is_dropped_after_the_frame_timeout():
    a, b = socket.socketpair()
    try:
        a.sendall(wire.MAGIC + b"\x00")  # a header begun and never finished; the peer stays connected
        start = time.monotonic()
        with pytest.raises(rdv.FrameError, match="incomplete frame header"):
            wire.recv_frame(b, SECRET, 0.5)
        assert time.monotonic() - start < 5
    finally:
        a.close()
        b.close()


@pytest.fixture(scope="module")
def kv_server():
    server = rdv.RendezvousServer(SECRET)
    server.start()
    yield server
    server.stop()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=1, max_size=300))
def test_the_server_drops_garbage_and_keeps_serving(kv_server, data):
    host, port = kv_server.address
    with socket.create_connection((host, port), timeout=5) as raw:
        raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)
        raw.settimeout(10)
        assert raw.recv(1 << 16) == b"", "the server answered garbage"  # it closes without a word
    client = rdv.KVClient(kv_server.addr, SECRET, timeout=10)
    try:
        assert client.ping()
    finally:
        client.close()


def test_a_client_with_another_secret_is_refused(kv_server):
    client = rdv.KVClient(kv_server.addr, b"x" * 32, timeout=5)
    try:
        with pytest.raises(rdv.RendezvousError):
            client.ping()
    finally:
        client.close()


# ---------------------------------------------------------------------------------------------
# the warm server's requests
# ---------------------------------------------------------------------------------------------
@FUZZ
@given(body=st.binary(max_size=300))
def test_warm_requests_from_any_bytes_parse_or_raise_bad_request(body):
    try:
        request = warm_server._parse_request(body)
    except warm_server.BadRequest:
        return
    assert isinstance(request, dict) and isinstance(request["op"], str)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                     max_leaves=10)


@FUZZ
@given(request=st.dictionaries(st.sampled_from(["op", "module", "args", "env", "cwd", "exit_report"]), _json, max_size=6)
       | _json, op=st.sampled_from(["spawn", "quit", "x"]))
def test_a_spawn_request_of_any_shape_is_validated(request, op):
    if isinstance(request, dict) and "op" in request:
        request["op"] = op
    body = json.dumps(request).encode()
    try:
        parsed = warm_server._parse_request(body)
    except warm_server.BadRequest:
        return
    if parsed["op"] == "spawn":  # what _spawn and the child use is there, with its type
        assert isinstance(parsed["module"], str) and parsed["module"]
        assert all(isinstance(a, str) for a in parsed["args"])
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in parsed["env"].items())
        assert isinstance(parsed["cwd"], str)
        assert parsed.get("exit_report") is None or warm_server._valid_report(parsed["exit_report"])


@FUZZ
@given(report=st.dictionaries(st.sampled_from(["addr", "secret", "key", "x"]),
                              _json | st.text(alphabet="0123456789abcdef:.²", max_size=12), max_size=4))
def test_an_exit_report_of_any_shape_is_valid_or_refused_never_an_error(report):
    """What the server keeps to tell a driver that a rank it killed exited: addr host:port, a hex
    secret, a key; anything else is a refusal (a BadRequest), never an exception of its own."""
    if warm_server._valid_report(report):
        host, _, port = report["addr"].rpartition(":")
        assert host and 0 < int(port) < 65536 and isinstance(bytes.fromhex(report["secret"]), bytes)
        assert isinstance(report["key"], str) and report["key"]


@FUZZ
@given(data=st.binary(max_size=200), declared=st.integers(min_value=0, max_value=1 << 32 - 1))
def test_read_request_never_hangs_on_a_short_or_lying_stream(data, declared):
    a, b = socket.socketpair()
    try:
        b.settimeout(5)
        a.sendall(warm_server._LEN.pack(declared) + data)
        a.shutdown(socket.SHUT_WR)
        try:
            request, fds = warm_server._read_request(b)
        except ValueError:  # BadRequest, or the stream ended early / a request too large
            return
        assert isinstance(request, dict) and fds == []
    finally:
        a.close()
        b.close()


@pytest.fixture
def open_warm_server():
    """A real warm server listening in a folder other users may enter (to reach its uid check)."""
    folder = tempfile.mkdtemp(prefix="hora-fuzz-", dir="/tmp")  # pytest's tmp folders are private
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "k-1.sock")
    env = dict(os.environ, HORA_WARM_PRELOAD="json", HORA_WARM_IDLE_TIMEOUT="60")
    try:
        warm._start_server(sys.executable, path, folder, env)
        os.chmod(path, 0o777)
        yield path
    finally:
        warm._ask_quit(path)
        warm._retire(path)
        shutil.rmtree(folder, ignore_errors=True)


def _ask(path: str, message: dict, timeout: float = 10) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        warm._send(conn, message)
        out = b""
        while not out.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                break
            out += chunk
        return out


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to a second uid needs root")
def test_the_warm_server_refuses_another_local_user(open_warm_server):
    path = open_warm_server
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user: nobody
        code = 3
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                answer = _ask(path, {"op": "quit"})
            except (ConnectionResetError, BrokenPipeError):  # closed on it: refused, as an EOF is
                answer = b""
            os.write(write_fd, b"answer:" + answer)
            code = 0
        except BaseException as exc:  # reported to the parent
            os.write(write_fd, f"error:{type(exc).__name__}: {exc}".encode())
        finally:
            os._exit(code)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    seen = os.read(read_fd, 4096)
    os.close(read_fd)
    assert os.waitstatus_to_exitcode(status) == 0, seen
    assert seen == b"answer:", f"another user got an answer: {seen!r}"
    # the server is still there for its owner, and the refused quit did not stop it
    assert json.loads(_ask(path, {"op": "hello"})) == {"error": "unknown op 'hello'"}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=1, max_size=200))
def test_the_warm_server_survives_garbage_from_its_owner(open_warm_server, data):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(15)
        conn.connect(open_warm_server)
        try:  # the server may drop garbage before reading all of it
            conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
            while conn.recv(4096):
                pass
        except (BrokenPipeError, ConnectionResetError):
            pass
    assert json.loads(_ask(open_warm_server, {"op": "hello"})) == {"error": "unknown op 'hello'"}


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to a second uid needs root")
def test_the_private_runtime_folder_keeps_other_users_out():
    folder = warm._runtime_dir()
    assert os.stat(folder).st_mode & 0o077 == 0
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                os.listdir(folder)
            except PermissionError:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# ---------------------------------------------------------------------------------------------
# the Store channel's signed files
# ---------------------------------------------------------------------------------------------
@FUZZ
@given(data=st.binary(max_size=400))
def test_store_channel_files_of_any_bytes_are_rejected_unread(data, monkeypatch):
    spy = _Loads()
    monkeypatch.setattr(store_channel, "pickle", spy)
    with pytest.raises(StoreError, match="not signed by this run's secret"):
        store_channel._open(SECRET, data, "s3://b/channel/x")
    assert spy.calls == 0


@FUZZ
@given(body=st.binary(max_size=200))
def test_a_store_channel_file_signed_by_another_run_is_rejected(body, monkeypatch):
    spy = _Loads()
    monkeypatch.setattr(store_channel, "pickle", spy)
    data = hmac.new(b"o" * 32, body, hashlib.sha256).digest() + body
    with pytest.raises(StoreError):
        store_channel._open(SECRET, data, "s3://b/channel/x")
    assert spy.calls == 0


def test_a_sealed_store_channel_file_round_trips():
    obj = {"rank": 1, "metrics": [0.5, 0.25], "blob": b"\x00\x01"}
    assert store_channel._open(SECRET, store_channel._seal(SECRET, obj), "x") == obj


def test_header_layout_is_what_the_fuzz_assumes():
    assert wire.HEADER.size == struct.calcsize("!4sI32s")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=_json | st.fixed_dictionaries({"op": st.just("spawn")}, optional={
    "module": _json, "args": _json, "env": _json, "cwd": _json}))
def test_the_warm_server_survives_well_framed_requests_of_any_shape(open_warm_server, request):
    """A framed JSON value of the wrong shape (a list, a spawn whose args are a number...) is
    answered or dropped; the server never forks for it and keeps serving."""
    answer = b""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(15)
        conn.connect(open_warm_server)
        try:  # the server may drop a request it refuses before reading all of it
            warm._send(conn, request)
            conn.shutdown(socket.SHUT_WR)
            while chunk := conn.recv(4096):
                answer += chunk
        except (BrokenPipeError, ConnectionResetError):
            pass
    assert b'"pid"' not in answer
    assert json.loads(_ask(open_warm_server, {"op": "hello"})) == {"error": "unknown op 'hello'"}
