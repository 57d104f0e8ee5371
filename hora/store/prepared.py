"""Prepared datasets by index: what ``prepare_data`` (or a ``fit``) materialized, found again without a DataFrame.

Horovod's ``util.prepare_data(...)`` yields a dataset index and ``Estimator.fit_on_parquet(dataset_idx=...)``
trains on it later. In hora a dataset lives under ``datasets/<fingerprint>`` (see
:mod:`hora.store.layout`); this module keeps the small index files that name it::

    <root>/prepared/<idx>.json     {"fingerprint": ...} of the dataset prepared as index idx
    <root>/prepared/latest.json    the dataset prepared or trained on last

Each index file is written atomically (:meth:`hora.store.Store.write_json`). The store never
imports an ML framework; nor does this module.
"""

from __future__ import annotations

import logging

from hora.errors import DataError
from hora.store.commit import load_dataset_info
from hora.store.dataset import DatasetInfo
from hora.store.horovod_paths import PREPARED, prepared_index_path
from hora.store.layout import join
from hora.store.store import Store

logger = logging.getLogger(__name__)


def index_path(store: Store, idx: int | None) -> str:
    """The index file of prepared dataset ``idx`` (None: the latest one).

    Raises:
        ConfigError: ``idx`` is not an int >= 0 or None.
    """
    return prepared_index_path(store.root, idx)


def next_index(store: Store) -> int:
    """The index a new ``prepare_data`` gets: one more than the highest recorded."""
    taken = []
    for entry in store.listdir(join(store.root, PREPARED)):
        stem = entry.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        if stem.isdigit():
            taken.append(int(stem))
    return max(taken) + 1 if taken else 0


def record(store: Store, info: DatasetInfo, idx: int | None = None) -> None:
    """Record ``info`` as prepared dataset ``idx`` (when given) and as the latest one.

    Raises:
        StoreError: the index file cannot be written.
    """
    entry = {"fingerprint": info.fingerprint}
    if idx is not None:
        store.write_json(index_path(store, idx), entry)
    store.write_json(index_path(store, None), entry)
    logger.debug("dataset %s recorded as prepared index %s", info.fingerprint, "latest" if idx is None else idx)


def find(store: Store, idx: int | None = None) -> DatasetInfo:
    """The committed dataset prepared as index ``idx`` (None: the latest prepared or trained on).

    Raises:
        DataError: no dataset was prepared under that index, or its files are gone (the
            message names the store path).
        ConfigError: a bad ``idx``.
    """
    fingerprint = store.prepared_fingerprint(idx)
    info = load_dataset_info(store, fingerprint)
    if info is None:
        raise DataError(f"{store.url_for(index_path(store, idx))} names dataset {fingerprint!r}, which is not "
                        f"committed in {store.url_for(store.layout.datasets_dir())}; prepare the data again")
    return info


__all__ = ["find", "record", "next_index", "index_path", "PREPARED"]
