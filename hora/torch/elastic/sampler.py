"""``ElasticSampler``: a DistributedSampler that remembers how far an epoch got, so that
after a reset the rest of the epoch is split among the ranks there are now (Horovod's
``hvd.elastic.ElasticSampler``)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sized
from typing import Any

import torch.utils.data

import hora.native as _hn
from hora.errors import ConfigError


class ElasticSampler(torch.utils.data.Sampler):
    """Partition ``dataset`` across the ranks; repartition what is left after a reset.

    Put it in the :class:`~hora.torch.elastic.TorchState`, call :meth:`record_batch`
    after each batch and :meth:`set_epoch` at the *end* of each epoch (which clears the
    record of processed samples).

    Args:
        dataset: a sized dataset (its length must not change).
        shuffle: shuffle the indices, the same way on every rank (default True).
        seed: the shuffle's seed, identical on every rank (default 0).

    Raises:
        ConfigError: ``dataset`` has no length.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        if not hasattr(dataset, "__len__"):
            raise ConfigError(f"ElasticSampler needs a dataset with a length, got {type(dataset).__name__}")
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a new shuffle) with nothing processed yet."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count a batch of ``batch_size`` samples per rank as processed (on every rank)."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Split the samples this epoch has not processed among the ranks there are now.

        Raises:
            NotInitializedError: hora.init() was not called.
        """
        self.num_replicas = _hn.size()
        self.rank = _hn.rank()
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = list(self.remaining_indices)
        while indices and len(indices) < self.total_size:  # pad to a multiple of the ranks
            indices += indices[: self.total_size - len(indices)]
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


__all__ = ["ElasticSampler"]
