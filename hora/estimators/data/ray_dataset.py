"""The estimators on Ray: ``backend="ray"`` and Ray Datasets as input and as predictions.

* ``backend="ray"`` (or a Ray Dataset as input with no ``backend``) starts the ranks as
  Ray actors in one placement group through :class:`hora.runners.RayLauncher`; with
  ``use_gpu=True`` each rank asks Ray for one GPU. For other resources, pass a launcher:
  ``backend=RayLauncher(cpus_per_rank=2, gpus_per_rank=1, strategy="SPREAD")``.
  The driver must be connected to a Ray cluster (``ray.init()`` first), as the Dask face
  needs a ``distributed.Client``.
* A Ray Dataset as input is checked on the driver (its columns and a sample of rows),
  then materialized to the Store once (:mod:`hora.store.ray_source`).
* Predictions on a Ray Dataset are lazy Ray Datasets (``map_batches`` over numpy
  batches, the model loaded once per Ray worker process):
  :func:`hora.estimators.driver.transform.ray_transform` keeps
  every input column and adds one prediction column per label (a float64 column, or a
  float64 tensor column for outputs of several values per row), a classifier's three
  columns, with the fit's column operations applied as on Spark and Dask.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from hora.errors import ConfigError, DataError

logger = logging.getLogger(__name__)


def require_ray(what: str = "backend='ray'") -> Any:
    """The ``ray`` module of a driver connected to a Ray cluster.

    Raises:
        ConfigError: Ray is not installed (names the extra to install) or the driver is
            not connected to a cluster (says to call ``ray.init()``).
    """
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"{what} needs Ray: pip install 'hora[ray]' (Ray Core and Ray Data); {exc}") from exc
    if not ray.is_initialized():
        raise ConfigError(f"{what} needs a connected Ray cluster: call ray.init() first (ray.init(address='auto') "
                          "joins a running cluster, ray.init() starts one on this machine)")
    return ray


def launcher_for(launcher: Any, use_gpu: bool) -> Any:
    """The :class:`~hora.runners.RayLauncher` of ``backend="ray"`` (one GPU per rank with
    ``use_gpu``), or the given RayLauncher once checked against ``use_gpu``.

    Raises:
        ConfigError: Ray missing or not initialized; ``use_gpu=True`` with a launcher
            that asks no GPU per rank.
    """
    require_ray()
    from hora.runners.launchers.ray.launcher import RayLauncher

    if isinstance(launcher, str):
        return RayLauncher(gpus_per_rank=1 if use_gpu else 0)
    if use_gpu and launcher.resources.gpus_per_rank <= 0:
        raise ConfigError("use_gpu=True but the RayLauncher asks no GPU per rank: pass "
                          "RayLauncher(gpus_per_rank=1, ...) (or backend='ray')")
    return launcher


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


def sample_columns(ds: Any, columns: Sequence[str], rows: int) -> dict[str, Any]:
    """The first ``rows`` rows of ``columns`` (numpy batches: one array or sequence per column).

    Raises:
        DataError: the dataset is empty.
    """
    try:
        batch = ds.select_columns(list(columns)).take_batch(rows, batch_format="numpy")
    except ValueError as exc:
        if "empty" not in str(exc):
            raise
        raise DataError("the Ray Dataset is empty: nothing to train on") from exc  # Ray's "The dataset is empty."
    if not batch or len(next(iter(batch.values()))) == 0:
        raise DataError("the Ray Dataset is empty: nothing to train on")
    return batch


__all__ = ["require_ray", "launcher_for", "is_ray_dataset", "column_names", "sample_columns"]
