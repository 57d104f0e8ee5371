"""``hora.common.util``: Horovod's ``horovod.common.util`` build queries (``gloo_built()``, ``mpi_built()``, ...).

They answer for this install of hora (see :mod:`hora.native.build_info`): Gloo and NCCL
through ``torch.distributed``, MPI through ``mpi4py`` and an ``mpiexec``.
"""

from hora.native.build_info import (
    ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, mpi_built, mpi_enabled, mpi_threads_supported,
    nccl_built, rocm_built,
)

__all__ = ["gloo_built", "mpi_built", "nccl_built", "cuda_built", "rocm_built", "ccl_built", "ddl_built",
           "gloo_enabled", "mpi_enabled", "mpi_threads_supported"]
