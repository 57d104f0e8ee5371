"""The ssh launcher's tests run against a real OpenSSH server (``benchmarks/_common/sshd.py``).

Without ``sshd``, ``ssh`` or ``ssh-keygen`` every test here is skipped with the name of
what is missing (Debian: ``apt-get install openssh-server openssh-client``;
``make system-deps`` does it).
"""

from __future__ import annotations

import pytest

from benchmarks._common.sshd import SshdUnavailable, running_sshd


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """One throwaway sshd on 127.0.0.1 and 127.0.0.2 for the test session."""
    try:
        with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
            yield server
    except SshdUnavailable as exc:
        pytest.skip(f"ssh tests need a real OpenSSH server: {exc}")
