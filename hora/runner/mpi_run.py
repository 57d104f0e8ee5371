"""``hora.runner.mpi_run``: which MPI ``mpiexec`` is (Horovod's ``is_open_mpi``)."""

from __future__ import annotations

import subprocess
from typing import Mapping

from hora.native.build_info import find_mpiexec


def mpi_version(env: Mapping[str, str] | None = None) -> str | None:
    """The output of ``mpiexec --version`` (None without an ``mpiexec``, or when it does not answer in 10 s)."""
    exe = find_mpiexec()
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10,
                             env=dict(env) if env is not None else None)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout + out.stderr


def is_open_mpi(env: Mapping[str, str] | None = None) -> bool:
    """Whether the ``mpiexec`` on PATH is Open MPI's (hora's ``--mpi`` launcher drives MPICH's Hydra)."""
    text = mpi_version(env) or ""
    return "Open MPI" in text or "OpenRTE" in text


def is_mpich(env: Mapping[str, str] | None = None) -> bool:
    """Whether the ``mpiexec`` on PATH is MPICH's (Hydra)."""
    text = mpi_version(env) or ""
    return "HYDRA" in text or "MPICH" in text


__all__ = ["is_open_mpi", "is_mpich", "mpi_version"]
