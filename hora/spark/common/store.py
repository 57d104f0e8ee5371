"""``hora.spark.common.store``: Horovod's path to the Store and its classes.

hora has one :class:`hora.store.Store` over fsspec for every URL scheme (local paths,
``hdfs://``, ``s3://``, ``dbfs:/``, ...). Horovod's ``LocalStore``, ``HDFSStore``,
``DBFSLocalStore`` and ``FilesystemStore`` are constructors of it taking Horovod's
arguments (:mod:`hora.store.horovod_stores`); ``Store.create(prefix_path)`` works as in Horovod.
"""

from hora.store import Store
from hora.store.horovod_stores import AbstractFilesystemStore, DBFSLocalStore, FilesystemStore, HDFSStore, LocalStore

__all__ = ["Store", "LocalStore", "HDFSStore", "DBFSLocalStore", "FilesystemStore", "AbstractFilesystemStore"]
