"""What is usable on this machine: the rows ``hora check`` prints (:func:`check_report`:
frameworks, collective backends, engines, stores, the resolver) and horovodrun's
``--check-build`` summary (:func:`check_build_summary`). :mod:`hora.cli` prints them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import threading

from hora.native.build_info import find_mpiexec


def check_build_summary(verbose: bool = False) -> str:
    """horovodrun's ``--check-build`` summary, with hora's answers (``hora check`` has details)."""
    import hora
    from hora.native import build_info

    def mark(ok: bool) -> str:
        return "X" if ok else " "

    torch_ok, tf_ok = _importable("torch"), _importable("tensorflow")
    gloo, mpi = build_info.gloo_built(), build_info.mpi_built()
    return "\n".join([
        *([""] if verbose else []),
        f"hora v{hora.__version__}:",
        "",
        "Available Frameworks:",
        f"    [{mark(tf_ok)}] TensorFlow",
        f"    [{mark(torch_ok)}] PyTorch",
        "    [ ] MXNet",
        "",
        "Available Controllers:",
        f"    [{mark(mpi)}] MPI",
        f"    [{mark(gloo)}] Gloo",
        "",
        "Available Tensor Operations:",
        f"    [{mark(build_info.nccl_built())}] NCCL",
        f"    [{mark(build_info.ddl_built())}] DDL",
        f"    [{mark(build_info.ccl_built())}] CCL",
        f"    [{mark(mpi)}] MPI",
        f"    [{mark(gloo)}] Gloo",
    ])


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_report() -> list[tuple[str, str, bool, str]]:
    """Rows ``(section, name, usable, detail)`` describing what is usable here."""
    rows: list[tuple[str, str, bool, str]] = []

    def add(section: str, name: str, ok: bool, detail: str) -> None:
        rows.append((section, name, ok, detail))

    # frameworks
    torch_v = _version("torch")
    add("frameworks", "torch", torch_v is not None and _importable("torch"), torch_v or "not installed")
    tf_v = _version("tensorflow") or _version("tensorflow-cpu") or _version("tensorflow_cpu")
    add("frameworks", "tensorflow", tf_v is not None and _importable("tensorflow"), tf_v or "not installed")
    keras_v = _version("keras")
    add("frameworks", "keras", keras_v is not None and _importable("keras"), keras_v or "not installed")
    light_v = _version("lightning") or _version("pytorch-lightning")
    add("frameworks", "lightning", light_v is not None, light_v or "not installed")

    # backends
    if torch_v is not None:
        try:
            import torch.distributed as dist

            add("backends", "gloo", bool(dist.is_available() and dist.is_gloo_available()), f"torch {torch_v}")
            import torch

            cuda = torch.cuda.is_available()
            n = torch.cuda.device_count() if cuda else 0
            nccl = bool(dist.is_available() and dist.is_nccl_available())
            add("backends", "nccl", nccl and n > 0,
                f"{n} CUDA device(s)" + ("" if nccl else ", torch built without NCCL"))
            from hora.native.backends.shm import availability

            add("backends", "shm", *availability())
        except Exception as exc:  # a broken torch install must not break `hora check`
            add("backends", "gloo", False, f"torch.distributed unusable: {exc}")
    else:
        add("backends", "gloo", False, "needs torch")
        add("backends", "nccl", False, "needs torch")
    mpi4py_v = _version("mpi4py")
    mpiexec = find_mpiexec()
    detail = f"mpi4py {mpi4py_v or 'not installed'}, mpiexec {mpiexec or 'not found'}"
    add("backends", "mpi", mpi4py_v is not None and mpiexec is not None, detail)

    # engines
    spark_v = _version("pyspark")
    java = shutil.which("java") or (os.environ.get("JAVA_HOME") and os.path.join(os.environ["JAVA_HOME"], "bin", "java"))
    add("engines", "pyspark", spark_v is not None, (spark_v or "not installed") + (f", java {java}" if spark_v else ""))
    dask_v, dist_v = _version("dask"), _version("distributed")
    add("engines", "dask/distributed", dask_v is not None and dist_v is not None,
        f"dask {dask_v or 'not installed'}, distributed {dist_v or 'not installed'}")
    ray_v = _version("ray")
    add("engines", "ray", ray_v is not None and _importable("ray"),
        f"ray {ray_v}" if ray_v else "not installed (pip install 'hora[ray]')")

    # stores
    stores = [
        ("file", "fsspec", "fsspec"),
        ("memory", "fsspec", "fsspec"),
        ("s3", "s3fs", "s3fs"),
        ("gs", "gcsfs", "gcsfs"),
        ("hdfs", "pyarrow", "pyarrow"),
        ("abfs", "adlfs", "adlfs"),
        ("dbfs", "fsspec", "fsspec"),
    ]
    for scheme, package, module in stores:
        v = _version(package)
        ok = v is not None and _importable(module)
        add("stores", f"{scheme}://", ok, f"{package} {v}" if v else f"needs {package}")

    # network
    for address in ("::ffff:127.0.0.1", _own_address()):
        if address:
            add("network", f"reverse lookup {address}", *reverse_lookup_check(address))
    return rows


def _own_address() -> str | None:
    """This host's address as a peer sees it (IPv4-mapped), or None if the name does not resolve."""
    import socket

    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return None if ip.startswith("127.") else f"::ffff:{ip}"


def reverse_lookup_check(address: str, *, resolve=None, limit: float = 1.0) -> tuple[bool, str]:
    """Whether a reverse lookup of ``address`` answers within ``limit`` seconds.

    torch's TCPStore (which every Gloo and NCCL init of hora sets up) reverse-resolves each
    peer's address, IPv4-mapped; a resolver that drops the query costs every init its
    retry timeout (5 s with glibc's defaults). ``resolve`` (address -> name) is for tests.
    """
    import socket
    import time

    if resolve is None:
        def resolve(addr: str) -> str:
            return socket.getnameinfo((addr, 0, 0, 0), 0)[0]

    answer: list[str] = []
    start = time.monotonic()
    probe = threading.Thread(target=lambda: answer.append(_quietly(resolve, address)), daemon=True)
    probe.start()
    probe.join(limit)
    took = time.monotonic() - start
    if probe.is_alive():
        return False, (f"no answer within {limit:g} s: each init of a job on this host may wait for the "
                       f"resolver (torch's TCPStore reverse-resolves its peers); add '{address} <name>' "
                       f"to /etc/hosts or fix the resolver")
    return True, f"-> {answer[0]} in {took * 1e3:.0f} ms"


def _quietly(resolve, address: str) -> str:
    try:
        return resolve(address)
    except OSError as exc:
        return f"(unknown: {exc.strerror or exc})"


__all__ = ["check_build_summary", "check_report", "reverse_lookup_check"]
