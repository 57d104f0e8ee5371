"""Torch adapter of the reader: batches as ``torch.Tensor`` (pinned memory when copying to CUDA).

torch is imported when an adapter is built, never when ``hora.store`` is imported.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from hora.errors import ConfigError
from hora.store.reader import Reader


class TorchBatches:
    """Wraps a :class:`~hora.store.reader.Reader`: ``len()`` and iteration like a DataLoader.

    Each batch is ``dict[str, torch.Tensor]`` on ``device``. Arrays the reader owns are
    shared with the tensors (``torch.from_numpy``); read-only views of Arrow memory are copied.
    With a CUDA device, tensors are pinned first and copied with ``non_blocking=True``.
    """

    def __init__(self, reader: Reader, device: Any = None, pin_memory: bool | None = None) -> None:
        import torch

        if not isinstance(reader, Reader):
            raise ConfigError(f"torch_batches needs a hora.store Reader, got {type(reader).__name__}")
        self.reader = reader
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        cuda = self.device.type == "cuda"
        if cuda and not torch.cuda.is_available():
            raise ConfigError(f"device {self.device} requested but CUDA is not available")
        self.pin_memory = cuda if pin_memory is None else bool(pin_memory)

    def __len__(self) -> int:
        return len(self.reader)

    def set_epoch(self, epoch: int) -> None:
        """Forwarded to :meth:`Reader.set_epoch`."""
        self.reader.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import torch

        for batch in self.reader:
            out = {}
            for name, arr in batch.items():
                if arr.dtype == np.bool_ or not arr.flags.writeable or not arr.flags.c_contiguous:
                    t = torch.from_numpy(np.array(arr, copy=True, order="C"))
                else:
                    t = torch.from_numpy(arr)
                if self.pin_memory:
                    t = t.pin_memory()
                if self.device.type != "cpu":
                    t = t.to(self.device, non_blocking=self.pin_memory)
                out[name] = t
            yield out


def torch_batches(reader: Reader, device: Any = None, pin_memory: bool | None = None) -> TorchBatches:
    """Batches of ``reader`` as dicts of torch tensors on ``device`` (see :class:`TorchBatches`).

    Raises:
        ConfigError: not a Reader, or a CUDA device without CUDA.
    """
    return TorchBatches(reader, device=device, pin_memory=pin_memory)


__all__ = ["TorchBatches", "torch_batches"]
