"""The estimators on Ray: ``backend="ray"`` and Ray Datasets as input and as predictions.

* ``backend="ray"`` (or a Ray Dataset as input with no ``backend``) starts the ranks as
  Ray actors in one placement group through :class:`hora.runners.RayLauncher`
  (:func:`hora.runners.resolve` builds it); with
  ``use_gpu=True`` each rank asks Ray for one GPU. For other resources, pass a launcher:
  ``backend=RayLauncher(cpus_per_rank=2, gpus_per_rank=1, strategy="SPREAD")``.
  The driver must be connected to a Ray cluster (``ray.init()`` first), as the Dask face
  needs a ``distributed.Client``.
* A Ray Dataset as input is checked on the driver (its columns and a sample of rows, through
  its :class:`~hora.store.ray_source.RaySource`), then materialized to the Store once (:mod:`hora.store.ray_source`).
* Predictions on a Ray Dataset are lazy Ray Datasets (``map_batches`` over numpy
  batches, the model loaded once per Ray worker process):
  :func:`hora.estimators.driver.transform.ray_transform` keeps
  every input column and adds one prediction column per label (a float64 column, or a
  float64 tensor column for outputs of several values per row), a classifier's three
  columns, with the fit's column operations applied as on Spark and Dask.
"""

from __future__ import annotations

import logging
from typing import Any

from hora.errors import DataError

logger = logging.getLogger(__name__)


def require_ray(what: str = "backend='ray'") -> Any:
    """The ``ray`` module of a driver connected to a Ray cluster (:func:`hora.runners.resolution.connected_ray`).

    Raises:
        ConfigError: Ray is not installed (names the extra to install) or the driver is
            not connected to a cluster (says to call ``ray.init()``).
    """
    from hora.runners.resolution import connected_ray

    return connected_ray(what)


def is_ray_dataset(obj: Any) -> bool:
    """Whether ``obj`` is a ``ray.data.Dataset`` (Ray is imported only for Ray's own objects)."""
    from hora.store.ray_source import is_ray_dataset as check

    return check(obj)


def column_names(ds: Any) -> list[str]:
    """The Ray Dataset's columns.

    Raises:
        DataError: it has no schema (no blocks, nothing to train on or predict).
    """
    names = ds.columns()
    if names is None:
        raise DataError("the Ray Dataset has no schema (it has no blocks)")
    return [str(c) for c in names]


__all__ = ["require_ray", "is_ray_dataset", "column_names"]
