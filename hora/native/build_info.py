"""What this install of hora can do, in Horovod's words (``hvd.nccl_built()``, ``hvd.mpi_enabled()``, ...).

The ``*_built`` functions answer for the installed packages, without initializing
anything: ``gloo_built`` (torch.distributed with Gloo: hora's default transport),
``nccl_built`` (the NCCL version code of a torch built with NCCL, else 0), ``mpi_built`` (mpi4py and an ``mpiexec``),
``cuda_built`` / ``rocm_built`` (the torch build), and ``ccl_built`` / ``ddl_built``
(oneCCL and IBM DDL: hora has no such transport, so always ``False``).

The ``*_enabled`` functions answer for the running job, after :func:`hora.native.init`:
which CPU backend the engine negotiates over.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys

from hora.errors import NotInitializedError


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def gloo_built() -> bool:
    """Whether torch.distributed with Gloo, hora's default transport, is available."""
    torch = _torch()
    if torch is None:
        return False
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_gloo_available())


def nccl_built() -> int:
    """The NCCL version code of the installed torch (``2.21.5`` -> 22105, as Horovod's
    ``NCCL_VERSION_CODE``), or 0 without NCCL (CUDA tensors go through NCCL when it has it).
    Horovod returns the code so that ``nccl_built() >= 2700`` can check for a feature."""
    torch = _torch()
    if torch is None:
        return 0
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_nccl_available()):
        return 0
    try:
        major, minor, patch = torch.cuda.nccl.version()[:3]
    except Exception:  # built with NCCL but it cannot say which: "some NCCL"
        return 1
    return major * 1000 + minor * 100 + patch if (major, minor) < (2, 9) else major * 10000 + minor * 100 + patch


def mpi_built() -> bool:
    """Whether mpi4py is installed and an ``mpiexec`` is on PATH (``hora run --mpi`` can work).

    MPI itself is not initialized by this check.
    """
    return importlib.util.find_spec("mpi4py") is not None and find_mpiexec() is not None


def find_mpiexec() -> str | None:
    """The ``mpiexec`` on PATH, else the one beside this interpreter (pip's mpich installs it there)."""
    return shutil.which("mpiexec") or shutil.which("mpiexec", path=os.path.dirname(sys.executable))


def cuda_built() -> bool:
    """Whether the installed torch is a CUDA build."""
    torch = _torch()
    return bool(torch is not None and torch.version.cuda)


def rocm_built() -> bool:
    """Whether the installed torch is a ROCm (HIP) build."""
    torch = _torch()
    return bool(torch is not None and getattr(torch.version, "hip", None))


def ccl_built() -> bool:
    """oneCCL: hora has no oneCCL transport."""
    return False


def ddl_built() -> bool:
    """IBM DDL: hora has no DDL transport."""
    return False


def _backend_name() -> str:
    from hora.native import ops

    if not ops.is_initialized():
        raise NotInitializedError("hora has not been initialized; call hvd.init() first")
    return ops.backend_name()


def gloo_enabled() -> bool:
    """Whether the running job negotiates over Gloo. Raises NotInitializedError before init()."""
    return _backend_name() == "gloo"


def mpi_enabled() -> bool:
    """Whether the running job negotiates over MPI. Raises NotInitializedError before init()."""
    return _backend_name() == "mpi"


def mpi_threads_supported() -> bool:
    """Whether MPI runs with ``MPI_THREAD_MULTIPLE`` (always ``False`` when the job is not on MPI).

    Raises NotInitializedError before init().
    """
    if _backend_name() != "mpi":
        return False
    from mpi4py import MPI

    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


BUILD_FUNCTIONS = ("gloo_built", "nccl_built", "mpi_built", "cuda_built", "rocm_built", "ccl_built", "ddl_built")
RUNTIME_FUNCTIONS = ("gloo_enabled", "mpi_enabled", "mpi_threads_supported")

__all__ = list(BUILD_FUNCTIONS + RUNTIME_FUNCTIONS)
