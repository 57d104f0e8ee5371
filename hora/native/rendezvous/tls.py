"""TLS for hora's control channels: a per-job self-signed certificate, pinned by the ranks.

With ``HORA_TLS=1`` (or ``tls=True`` on the launch) the driver makes one certificate per
launch attempt (:func:`make_job_certificate`: EC P-256, valid for
:data:`VALIDITY_S`, the run's id as its subject and SAN) and every connection to the
driver service and to the rendezvous server is TLS: the server side presents that
certificate (:func:`server_context`), the client side trusts that certificate and nothing
else (:func:`client_context`: no CA chain, no system store, no host-name check) and checks
its SHA-256 fingerprint once more after the handshake (:func:`connect`). The HMAC of every
frame (:mod:`hora.native.rendezvous.protocol`) stays: TLS hides the frames, the job secret
still says who may speak.

The certificate belongs to the job's secret: :func:`register` files it under the secret,
and every :class:`~hora.native.rendezvous.KVClient` and
:class:`~hora.native.rendezvous.RendezvousServer` of that secret finds it with
:func:`for_secret`. A launch spec carries it to the ranks (the private key too, for the
Spark launcher's rendezvous server in rank 0's task: it travels where the job secret
travels); a rank started from its environment pins the certificate in ``HORA_TLS_CERT``
(no key). Collectives stay on Gloo, NCCL or MPI, as before.

Needs the ``cryptography`` package only on the driver (``pip install 'hora[tls]'``); the
ranks use the standard library's :mod:`ssl`.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import functools
import hashlib
import logging
import os
import socket
import ssl
import tempfile
import threading

from hora import settings
from hora.errors import ConfigError, RendezvousError
from hora.native.rendezvous.contract import ENV_SECRET

log = logging.getLogger("hora.native.rendezvous.tls")

ENV_TLS = "HORA_TLS"
ENV_TLS_CERT = "HORA_TLS_CERT"
#: how long a job certificate is valid (a relaunch makes a new one); it starts 5 minutes in the past
#: so that hosts whose clocks lag a little accept it
VALIDITY_S = 7 * 24 * 3600.0
EXTRA = "hora[tls]"


@dataclasses.dataclass(frozen=True)
class JobCertificate:
    """One job's certificate (DER) and, on the processes that serve, its private key (PEM).

    ``repr()`` shows the fingerprint only, never the key.
    """

    cert_der: bytes = dataclasses.field(repr=False)
    key_pem: bytes | None = dataclasses.field(default=None, repr=False)

    @functools.cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the certificate's DER bytes, hex."""
        return hashlib.sha256(self.cert_der).hexdigest()

    def __repr__(self) -> str:
        return f"JobCertificate(sha256={self.fingerprint[:16]}..., key={'yes' if self.key_pem else 'no'})"

    def pin(self) -> JobCertificate:
        """The certificate alone (what a client needs)."""
        return JobCertificate(self.cert_der)

    def to_text(self) -> str:
        """The certificate as one line of base64 (``HORA_TLS_CERT``); never the key."""
        return base64.b64encode(self.cert_der).decode()

    @classmethod
    def from_text(cls, text: str) -> JobCertificate:
        """The certificate of :meth:`to_text`.

        Raises:
            ConfigError: ``text`` is not base64 of a certificate (``HORA_TLS_CERT`` named).
        """
        try:
            der = base64.b64decode(text.encode(), validate=True)
            ssl.DER_cert_to_PEM_cert(der)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{ENV_TLS_CERT} is not a base64 DER certificate: {exc}") from None
        if not der:
            raise ConfigError(f"{ENV_TLS_CERT} is empty")
        return cls(der)


def enabled(tls: bool | None = None) -> bool:
    """Whether a launch uses TLS: ``tls`` when given, else ``HORA_TLS``."""
    return bool(settings.get(ENV_TLS)) if tls is None else bool(tls)


def make_job_certificate(job: str, hosts: tuple[str, ...] = (), validity_s: float = VALIDITY_S) -> JobCertificate:
    """A fresh self-signed certificate and key for the job ``job`` (EC P-256, SHA-256).

    Its subject's common name and a DNS SAN are ``job``; ``hosts`` (addresses or names the
    driver is reached at) are added as SANs, for tools that look; hora's clients pin the
    certificate itself and check no name.

    Raises:
        ConfigError: the ``cryptography`` package is missing (names the extra to install).
    """
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        raise ConfigError(f"TLS ({ENV_TLS}=1 or tls=True) needs the cryptography package on the driver: "
                          f"pip install '{EXTRA}'") from None
    import ipaddress

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, job[:64] or "hora"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "hora job")])
    sans: list[x509.GeneralName] = [x509.DNSName(job[:253] or "hora")]
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if host:
                sans.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(seconds=validity_s))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return JobCertificate(cert.public_bytes(serialization.Encoding.DER), key_pem)


@functools.lru_cache(maxsize=16)
def server_context(cert: JobCertificate) -> ssl.SSLContext:
    """A server context presenting ``cert`` (TLS 1.2 or later); one per certificate and process.

    Raises:
        ConfigError: ``cert`` has no private key (only the driver's, or a spec's, has one).
    """
    if not cert.key_pem:
        raise ConfigError("this process has the job's TLS certificate without its key: it cannot serve TLS")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # load_cert_chain reads files only: a private file that lives for the call
    fd, path = tempfile.mkstemp(prefix="hora-tls-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as fh:  # mkstemp: mode 0600
            fh.write(ssl.DER_cert_to_PEM_cert(cert.cert_der).encode() + cert.key_pem)
        ctx.load_cert_chain(path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return ctx


@functools.lru_cache(maxsize=16)
def client_context(pinned: JobCertificate) -> ssl.SSLContext:
    """A client context that trusts the certificate ``pinned`` and nothing else (no CA store,
    no host-name check: the peer must present exactly this certificate)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=pinned.cert_der)
    return ctx


def wrap_client(sock: socket.socket, pinned: JobCertificate, where: str) -> ssl.SSLSocket:
    """``sock`` (connected, blocking or with a timeout) after a TLS handshake with a peer that
    presented exactly ``pinned``; the socket is closed on failure.

    Raises:
        RendezvousError: the handshake failed (a plaintext server, another job's certificate),
            naming ``where`` (the peer's ``host:port``).
    """
    try:
        tls = client_context(pinned).wrap_socket(sock)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise RendezvousError(f"refused the server at {where}: its TLS certificate is not this job's "
                              f"({exc.verify_message or exc})") from None
    except (ssl.SSLError, ConnectionError, socket.timeout, OSError) as exc:
        sock.close()
        raise RendezvousError(f"TLS handshake with {where} failed ({type(exc).__name__}: {exc}): the server there "
                              "does not speak TLS (a run without TLS?) or closed the connection") from None
    got = tls.getpeercert(binary_form=True) or b""
    if hashlib.sha256(got).hexdigest() != pinned.fingerprint:  # the context trusts only it; checked once more
        tls.close()
        raise RendezvousError(f"refused the server at {where}: its TLS certificate is not this job's")
    return tls


def connect(addr: tuple[str, int], secret: bytes, timeout: float) -> socket.socket:
    """A TCP connection to ``addr`` (``TCP_NODELAY``), in TLS to the job's pinned certificate when
    the job of ``secret`` uses TLS.

    Raises:
        OSError: the TCP connect failed (the caller retries).
        RendezvousError: the TLS handshake failed (no retry helps), naming the address.
    """
    sock = socket.create_connection(addr, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pinned = for_secret(secret)
    if pinned is None:
        return sock
    return wrap_client(sock, pinned, f"{addr[0]}:{addr[1]}")


def environ(secret: bytes) -> dict[str, str]:
    """``HORA_TLS_CERT`` for a rank of the job of ``secret`` when it uses TLS (the certificate
    to pin, never its key); empty otherwise. Next to :meth:`WorkerEnv.to_environ`."""
    cert = for_secret(secret)
    return {ENV_TLS_CERT: cert.to_text()} if cert is not None else {}


# which job uses which certificate -----------------------------------------------------------
_jobs: dict[bytes, JobCertificate] = {}
_lock = threading.Lock()


def register(secret: bytes, cert: JobCertificate | None) -> None:
    """File ``cert`` as the TLS certificate of the job of ``secret`` in this process (None: no-op).
    A certificate with its key is kept over one without."""
    if cert is None:
        return
    with _lock:
        known = _jobs.get(secret)
        if known is None or (cert.key_pem and not known.key_pem):
            _jobs[secret] = cert


def forget(secret: bytes) -> None:
    """Drop the job of ``secret`` (its run ended)."""
    with _lock:
        _jobs.pop(secret, None)


def for_secret(secret: bytes) -> JobCertificate | None:
    """The TLS certificate of the job of ``secret``: registered in this process, else the one in
    ``HORA_TLS_CERT`` when ``HORA_SECRET`` is this secret; None when the job uses no TLS."""
    with _lock:
        cert = _jobs.get(secret)
    if cert is not None:
        return cert
    text = settings.get(ENV_TLS_CERT)
    own = settings.get(ENV_SECRET)
    if text and own and own == secret.hex():
        cert = JobCertificate.from_text(text)
        register(secret, cert)
        return cert
    return None


__all__ = ["ENV_TLS", "ENV_TLS_CERT", "EXTRA", "JobCertificate", "VALIDITY_S", "client_context", "connect",
           "enabled", "environ", "for_secret", "forget", "make_job_certificate", "register", "server_context", "wrap_client"]
