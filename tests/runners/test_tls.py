"""TLS on the control plane (``HORA_TLS=1`` / ``tls=True``), over real sockets: a run on two
loopback hosts (the second reached over a real sshd) agrees over TLS; the driver service
refuses a plaintext peer and shows it no frame; a client pinned to another job's certificate
refuses the server; a client with TLS refuses a plaintext server; without ``cryptography``
the run stops with the extra to install."""

from __future__ import annotations

import logging
import os
import pickle
import socket
import sys

import pytest

from hora.errors import ConfigError, RendezvousError
from hora.native.rendezvous import tls
from hora.native.rendezvous import KVClient, RendezvousServer, make_secret
from hora.native.rendezvous.protocol import HEADER, MAGIC, sign

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def job_cert():
    pytest.importorskip("cryptography")
    return tls.make_job_certificate("test-tls-job", hosts=("127.0.0.1",))


def _plain_ping(addr: tuple[str, int], secret: bytes) -> bytes:
    """What a plaintext peer that speaks the protocol (a signed ping) gets back: every byte
    until the server closes (or 5 s pass)."""
    body = pickle.dumps(("ping",))
    with socket.create_connection(addr, timeout=5) as sock:
        sock.sendall(HEADER.pack(MAGIC, len(body), sign(secret, body)) + body)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    return got


def _allreduce_and_probe() -> tuple[float, bool, bytes]:
    """A rank: allreduce its rank + 1, say whether its environment pins the run's certificate,
    and what the driver service and the rendezvous server send a plaintext peer (this rank's
    own host as the sender)."""
    import numpy as np

    import hora.native as hn

    total = hn.allreduce(np.array([float(hn.rank() + 1)] * 4), op=hn.Sum, name="tls")
    secret = bytes.fromhex(os.environ["HORA_SECRET"])
    answers = b""
    for var in ("HORA_DRIVER_ADDR", "HORA_RENDEZVOUS_ADDR"):
        host, _, port = os.environ[var].rpartition(":")
        answers += _plain_ping((host, int(port)), secret)
    return float(total[0]), bool(os.environ.get("HORA_TLS_CERT")), answers


def _check_tls_run(out: list) -> None:
    assert [v[0] for v in out] == [3.0, 3.0]
    assert [v[1] for v in out] == [True, True]  # each rank pinned the run's certificate
    for _, _, answer in out:  # the servers sent a plaintext peer no frame, no pickle
        assert MAGIC not in answer and b"\x80\x05" not in answer and b"pong" not in answer


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    from benchmarks._common.sshd import SshdUnavailable, running_sshd

    try:
        with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
            yield server
    except SshdUnavailable as exc:
        pytest.skip(f"two loopback hosts need a real OpenSSH server: {exc}")


@pytest.mark.timeout(180)
def test_a_run_on_two_loopback_hosts_agrees_over_tls(sshd, monkeypatch, job_cert):
    import hora.runners as hr
    from hora.runners import HostsLauncher
    from hora.runners.rank.ssh import SshOptions

    monkeypatch.setenv("HORA_SSH_ARGS", sshd.env["HORA_SSH_ARGS"])
    launcher = HostsLauncher("127.0.0.1:1,127.0.0.2:1", ssh=SshOptions(port=sshd.port, identity_file=sshd.key))
    _check_tls_run(hr.run(_allreduce_and_probe, num_proc=2, backend=launcher, verbose=0, tls=True, start_timeout=60))


@pytest.mark.spark
@pytest.mark.timeout(180)
def test_a_spark_run_over_tls_whose_rendezvous_server_runs_in_a_task(spark, job_cert):
    """On Spark, rank 0's task serves the rendezvous: it presents the run's certificate too."""
    import hora.runners as hr

    _check_tls_run(hr.run(_allreduce_and_probe, num_proc=2, backend="spark", spark=spark, verbose=0, tls=True))


@pytest.mark.timeout(60)
def test_a_plaintext_peer_sees_no_frame_and_is_refused_naming_its_address(job_cert, caplog):
    secret = make_secret()
    with RendezvousServer(secret, tls=job_cert) as server:
        # the job's own client over TLS: values of several MB cross the non-blocking loop intact
        tls.register(secret, job_cert.pin())
        try:
            client = KVClient(server.addr, secret, timeout=10)
            big = os.urandom(3 << 20)
            client.set("big", big)
            assert client.get("big") == big
            client.post([("set", "beat", b"1")])
            assert client.wait(["beat"], timeout=5) == [b"1"]
            client.close()
        finally:
            tls.forget(secret)
        caplog.set_level(logging.WARNING, logger="hora.native.rendezvous")
        answer = _plain_ping(server.address, secret)
        assert MAGIC not in answer and b"\x80\x05" not in answer and b"pong" not in answer
        plain = KVClient(server.addr, secret, timeout=5)  # no certificate filed for it: plaintext
        with pytest.raises(RendezvousError, match=f"rendezvous server at {server.addr}.*TLS"):
            plain.ping()
    assert "no TLS handshake with this job's certificate" in caplog.text
    assert "127.0.0.1:" in caplog.text  # the refused peer's address


@pytest.mark.timeout(60)
def test_a_server_with_another_jobs_certificate_is_refused(job_cert):
    secret = make_secret()
    other = tls.make_job_certificate("another-job")
    with RendezvousServer(secret, tls=other) as server:
        tls.register(secret, job_cert.pin())
        try:
            with pytest.raises(RendezvousError, match=f"refused the server at {server.addr}: its TLS certificate "
                                                      "is not this job's"):
                KVClient(server.addr, secret, timeout=5).ping()
        finally:
            tls.forget(secret)


@pytest.mark.timeout(60)
def test_a_plaintext_server_is_refused_when_tls_is_on(job_cert):
    secret = make_secret()
    with RendezvousServer(secret) as server:  # plaintext: its job files no certificate
        assert server.tls is None
        tls.register(secret, job_cert.pin())
        try:
            with pytest.raises(RendezvousError, match=f"TLS handshake with {server.addr} failed.*does not speak TLS"):
                KVClient(server.addr, secret, timeout=5).ping()
        finally:
            tls.forget(secret)


@pytest.mark.timeout(60)
def test_tls_without_cryptography_names_the_extra_before_any_rank_starts(monkeypatch):
    import hora.runners as hr

    for name in [m for m in sys.modules if m == "cryptography" or m.startswith("cryptography.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cryptography", None)  # import cryptography raises ImportError
    monkeypatch.setenv("HORA_TLS", "1")
    with pytest.raises(ConfigError, match=r"pip install 'hora\[tls\]'"):
        hr.run(os.getpid, num_proc=1, verbose=0)


@pytest.mark.timeout(90)
def test_hora_run_tls_gives_command_ranks_the_pin_and_its_service_refuses_plaintext(tmp_path, job_cert):
    import subprocess
    import textwrap

    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent("""
        import os, pickle, socket
        from hora.native.rendezvous.protocol import HEADER, MAGIC, sign
        host, _, port = os.environ["HORA_DRIVER_ADDR"].rpartition(":")
        body = pickle.dumps(("ping",))
        answer = b""
        with socket.create_connection((host, int(port)), timeout=5) as sock:  # a signed ping, in plaintext
            sock.sendall(HEADER.pack(MAGIC, len(body), sign(bytes.fromhex(os.environ["HORA_SECRET"]), body)) + body)
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except (ConnectionResetError, TimeoutError):
                pass
        print("pinned", bool(os.environ.get("HORA_TLS_CERT")), "frame", MAGIC in answer, flush=True)
    """))
    res = subprocess.run([sys.executable, "-m", "hora", "run", "--tls", "-np", "2", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=80, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("pinned True frame False") == 2, res.stdout
