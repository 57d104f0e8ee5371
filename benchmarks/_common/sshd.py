"""A real OpenSSH server listening on 127.0.0.1 and 127.0.0.2 (tests and benchmarks).

:func:`running_sshd` starts Debian's ``/usr/sbin/sshd`` in the
foreground with a throwaway host key, a throwaway user key and its own
``authorized_keys`` in a private folder, on a free port; clients get
``HORA_SSH_ARGS=-o UserKnownHostsFile=<that folder>/known_hosts`` so the host key is
recorded there, not in ``~/.ssh``. It touches no file of the user's: it snapshots
``~/.ssh`` anyway and restores it (and removes ``/run/sshd`` if it had to create it and
no other sshd runs). :func:`missing` names what is not installed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")


@dataclasses.dataclass(frozen=True)
class Sshd:
    """A running test sshd."""

    port: int
    key: str  # the client's private key (-i)
    folder: Path
    known_hosts: Path

    @property
    def env(self) -> dict[str, str]:
        """Environment for launchers: the known_hosts file of this server's folder."""
        return {"HORA_SSH_ARGS": f"-o UserKnownHostsFile={self.known_hosts}"}

    def args(self) -> list[str]:
        """``-p PORT -i KEY`` for ``hora run``."""
        return ["-p", str(self.port), "-i", self.key]


class SshdUnavailable(Exception):
    """sshd is not installed or did not start."""


def missing() -> str | None:
    """What is not installed, in words (None when sshd, ssh and ssh-keygen are)."""
    for path, package in ((SSHD, "openssh-server"), (shutil.which("ssh"), "openssh-client"),
                          (shutil.which("ssh-keygen"), "openssh-client")):
        if not path or not os.path.exists(path):
            name = os.path.basename(path) if path else ("ssh" if package == "openssh-client" else "sshd")
            return f"{name} is not installed (Debian: apt-get install {package})"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    for host in ("127.0.0.1", "127.0.0.2"):
        try:
            with socket.create_connection((host, port), timeout=1):
                pass
        except OSError:
            return False
    return True


def _snapshot(folder: Path) -> dict[str, bytes] | None:
    if not folder.is_dir():
        return None
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def _restore(folder: Path, snapshot: dict[str, bytes] | None) -> None:
    if snapshot is None:
        if folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
        return
    folder.mkdir(mode=0o700, exist_ok=True)  # (removed meanwhile: its files come back below)
    for p in folder.iterdir():
        if p.is_file() and p.name not in snapshot:
            p.unlink()
    for name, data in snapshot.items():
        path = folder / name
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)


def _other_sshd_running() -> bool:
    """Another sshd (another test session's) may still need the privilege separation folder."""
    import psutil

    for p in psutil.process_iter(["exe", "name"]):
        try:
            if p.info["name"] == "sshd" or (p.info["exe"] or "").endswith("/sshd"):
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


@contextlib.contextmanager
def running_sshd(folder: Path):
    """Start a throwaway sshd with its keys in ``folder`` (a private, empty folder); yield :class:`Sshd`.

    Raises:
        SshdUnavailable: not installed, or it did not start (the reason is the message).
    """
    problem = missing()
    if problem:
        raise SshdUnavailable(problem)
    os.chmod(folder, 0o700)
    user_ssh = Path(os.path.expanduser("~")) / ".ssh"
    saved = _snapshot(user_ssh)
    made_privsep = False
    if not PRIVSEP_DIR.is_dir():
        try:
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True)
            made_privsep = True
        except OSError as exc:
            raise SshdUnavailable(f"sshd needs its privilege separation folder {PRIVSEP_DIR}: {exc}") from None
    for name in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True)
    (folder / "authorized_keys").write_bytes((folder / "user_key.pub").read_bytes())
    port = _free_port()
    config = folder / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", "ListenAddress 127.0.0.2",
        f"HostKey {folder / 'host_key'}", f"PidFile {folder / 'sshd.pid'}",
        f"AuthorizedKeysFile {folder / 'authorized_keys'}", "StrictModes no", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "PermitRootLogin prohibit-password",
        "MaxStartups 100:30:200", "MaxSessions 100", "PrintMotd no", "LogLevel ERROR",
    ]) + "\n")
    log = open(folder / "sshd.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not _listening(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                text = (folder / "sshd.log").read_text(errors="replace")[-2000:]
                raise SshdUnavailable(f"sshd did not start: {text}")
            time.sleep(0.1)
        yield Sshd(port=port, key=str(folder / "user_key"), folder=folder, known_hosts=folder / "known_hosts")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        _restore(user_ssh, saved)
        if made_privsep and not _other_sshd_running():
            shutil.rmtree(PRIVSEP_DIR, ignore_errors=True)
