"""Which CUDA device a rank uses, the driver-side check that ``use_gpu=True`` can be honoured, and
how many CPU threads a rank's torch uses (:func:`set_rank_threads`).

The mapping is a pure function (:func:`pick_device_index`) so that it is testable without a GPU:
the Spark task's GPU addresses win (they are physical ids, translated through ``CUDA_VISIBLE_DEVICES``),
otherwise the rank's local rank indexes the visible devices. More ranks on a host than visible GPUs is
an error naming the rank and the devices, unless sharing is asked for explicitly with
``HORA_GPU_SHARING=1`` (then it is logged): NCCL refuses two ranks on one device.
"""
from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

from hora import settings
from hora.errors import ConfigError
from hora.threads import host_cores, rank_threads

log = logging.getLogger(__name__)

ENV_GPU_SHARING = "HORA_GPU_SHARING"


def set_rank_threads(local_size: int) -> int:
    """Apply :func:`hora.threads.rank_threads` to this process's torch (its share of the host's
    cores unless ``OMP_NUM_THREADS`` or ``HORA_RANK_THREADS`` says otherwise); the threads it now uses."""
    import torch

    threads = rank_threads(local_size)
    if threads is not None and torch.get_num_threads() != threads:
        log.debug("rank threads: %d (host cores %d, %d rank(s) on the host)", threads, host_cores(), local_size)
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def _visible(visible_devices: str | None) -> list[str] | None:
    if visible_devices is None or visible_devices.strip() == "":
        return None
    return [d.strip() for d in visible_devices.split(",") if d.strip()]


def pick_device_index(*, rank: int, local_rank: int, local_size: int, device_count: int,
                      visible_devices: str | None = None, task_gpu_addresses: Sequence[str] | None = None,
                      allow_sharing: bool = False) -> int:
    """Return the CUDA device index (as torch numbers the visible devices) that a rank should use.

    Args:
        rank: the rank's global rank (named in errors).
        local_rank: its rank among the ranks of its host.
        local_size: how many ranks run on its host.
        device_count: ``torch.cuda.device_count()`` in the rank's process.
        visible_devices: the value of ``CUDA_VISIBLE_DEVICES`` (``None`` when unset).
        task_gpu_addresses: a Spark task's ``TaskContext.resources()['gpu'].addresses`` (physical ids).
        allow_sharing: let several ranks share one device (round robin), logged.

    Raises:
        ConfigError: no device is visible; the task's GPU address is not among the visible devices;
            more ranks on the host than devices (without ``allow_sharing``).
    """
    visible = _visible(visible_devices)
    if device_count <= 0:
        raise ConfigError(f"use_gpu=True but rank {rank} on host {socket.gethostname()} sees no CUDA device "
                          f"(CUDA_VISIBLE_DEVICES={visible_devices!r})")
    if task_gpu_addresses:
        address = str(task_gpu_addresses[0]).strip()
        if visible is not None:
            if address not in visible:
                raise ConfigError(f"rank {rank}: the Spark task's GPU address {address} is not among "
                                  f"CUDA_VISIBLE_DEVICES={visible_devices!r}")
            index = visible.index(address)
        else:
            try:
                index = int(address)
            except ValueError as exc:
                raise ConfigError(f"rank {rank}: the Spark task's GPU address {address!r} is not a device "
                                  "number; set CUDA_VISIBLE_DEVICES on the executors") from exc
        if not 0 <= index < device_count:
            raise ConfigError(f"rank {rank}: the Spark task's GPU address {address} maps to device {index}, "
                              f"but only {device_count} CUDA device(s) are visible")
        return index
    if local_rank < 0:
        raise ConfigError(f"rank {rank}: local_rank={local_rank} must be >= 0")
    if max(local_size, local_rank + 1) > device_count:
        devices = ", ".join(f"cuda:{i}" for i in range(device_count))
        if not allow_sharing:
            raise ConfigError(
                f"rank {rank} (local rank {local_rank}) has no GPU of its own: {local_size} ranks on host "
                f"{socket.gethostname()} but only {device_count} CUDA device(s) visible ({devices}). "
                f"Run at most {device_count} rank(s) per host (num_proc / -np), or set {ENV_GPU_SHARING}=1 to "
                "share devices (not with NCCL, which refuses two ranks on one device)")
        log.warning("rank %d (local rank %d) shares cuda:%d with other ranks (%s=1, %d ranks, %d devices)",
                    rank, local_rank, local_rank % device_count, ENV_GPU_SHARING, local_size, device_count)
    return local_rank % device_count


def _spark_task_gpus() -> list[str] | None:
    """The GPU addresses Spark assigned to the current task, or None outside a Spark task."""
    try:
        from pyspark import TaskContext  # type: ignore[import-not-found]
    except ImportError:
        return None
    ctx = TaskContext.get()
    if ctx is None:
        return None
    gpu = ctx.resources().get("gpu")
    return list(gpu.addresses) if gpu is not None and gpu.addresses else None


def rank_device(rank: int, local_rank: int, local_size: int) -> Any:
    """Return the ``torch.device`` this rank should use and make it the current CUDA device.

    Raises:
        ConfigError: as :func:`pick_device_index`.
    """
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = pick_device_index(rank=rank, local_rank=local_rank, local_size=local_size, device_count=count,
                              visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                              task_gpu_addresses=_spark_task_gpus(),
                              allow_sharing=bool(settings.get(ENV_GPU_SHARING)))
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_gpus_before_launch(use_gpu: bool, launcher: Any, num_proc: int, client: Any = None,
                             timeout: float = 60.0) -> None:
    """Driver-side check that ``use_gpu=True`` can be honoured, before any rank starts.

    Local launcher: the driver's own GPUs (the ranks run on this host) must number at least ``num_proc``.
    Dask: every worker is asked for its ``torch.cuda.device_count()`` (``timeout`` seconds each); one without a
    GPU, or that does not answer, is named.

    Raises:
        ConfigError: no GPU visible, naming the host or the Dask worker; more local ranks than GPUs.
    """
    if not use_gpu:
        return
    name = launcher if isinstance(launcher, str) else getattr(launcher, "name", None)
    if name == "local":
        count = _cuda_count()
        host = socket.gethostname()
        if count == 0:
            raise ConfigError(f"use_gpu=True but host {host} (the local launcher's) sees no CUDA device")
        if num_proc > count and not settings.get(ENV_GPU_SHARING):
            raise ConfigError(f"use_gpu=True with num_proc={num_proc} on host {host}, which has {count} CUDA "
                              f"device(s): ranks {count}..{num_proc - 1} would have no GPU of their own; "
                              f"lower num_proc or set {ENV_GPU_SHARING}=1")
    elif name == "dask" and client is not None:
        from hora.runners.launchers.dask import worker_infos

        workers = list(worker_infos(client))
        futures = {w: client.submit(_cuda_count, workers=[w], allow_other_workers=False, pure=False) for w in workers}
        counts = {}
        for worker, future in futures.items():
            try:
                counts[worker] = future.result(timeout=timeout)
            except Exception as exc:  # a worker that cannot answer is named, not waited on forever
                raise ConfigError(f"use_gpu=True: Dask worker {worker} did not report its CUDA devices within "
                                  f"{timeout:.0f}s ({type(exc).__name__}: {exc})") from exc
        without = sorted(worker for worker, count in counts.items() if int(count) == 0)
        if without:
            raise ConfigError(f"use_gpu=True but Dask worker(s) {', '.join(without)} see no CUDA device")


def inference_device() -> Any:
    """The CUDA device a transform task infers on: the Spark task's GPU when Spark assigned one, else the
    current CUDA device (cuda:0 unless the process pinned another).

    Raises:
        ConfigError: no CUDA device is visible, naming the host.
    """
    import torch

    count = _cuda_count()
    if count == 0:
        raise ConfigError(f"use_gpu=True for transform but host {socket.gethostname()} sees no CUDA device "
                          f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
                          "transform with use_gpu=False")
    gpus = _spark_task_gpus()
    if gpus:
        index = pick_device_index(rank=0, local_rank=0, local_size=1, device_count=count,
                                  visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), task_gpu_addresses=gpus)
    else:
        index = torch.cuda.current_device()
    return torch.device("cuda", index)
