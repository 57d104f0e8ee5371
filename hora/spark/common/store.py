"""``hora.spark.common.store``: Horovod's path to the Store (``Store.create(prefix_path)`` works as in Horovod).

hora has one :class:`hora.store.Store` over fsspec for every URL scheme (local paths,
``hdfs://``, ``s3://``, ``dbfs:/``, ...); Horovod's per-filesystem classes map to it.
"""

from __future__ import annotations

from typing import Any

from hora.store import Store

_HOROVOD_CLASSES = ("LocalStore", "HDFSStore", "FilesystemStore", "DBFSLocalStore", "AbstractFilesystemStore")


def __getattr__(name: str) -> Any:
    if name in _HOROVOD_CLASSES:  # an ImportError, so `from ... import HDFSStore` shows this message
        raise ImportError(
            f"hora.spark.common.store has no {name}: hora's one Store handles every filesystem; use "
            f"Store.create(url) with a local path, 'hdfs://...', 's3://...' or 'dbfs:/...'"
        )
    raise AttributeError(f"module 'hora.spark.common.store' has no attribute {name!r}")


__all__ = ["Store"]
