"""The data path: a Store over fsspec, DataFrame materialization to Parquet, per-rank readers.

>>> from hora.store import Store, materialize, make_reader
>>> store = Store.create("file:///tmp/hora")
>>> info = materialize(df, store, feature_cols=["features"], label_cols=["label"], validation=0.2)
>>> for batch in make_reader(store, info, rank=0, size=2, batch_size=64, epoch=0): ...

Horovod's Store classes (``LocalStore``, ``HDFSStore``, ``DBFSLocalStore``, ``FilesystemStore``)
are constructors of the one Store (:mod:`hora.store.horovod_stores`).

Adapters: :func:`torch_batches` (torch tensors, pinned memory for CUDA) and
:func:`make_tf_dataset` (``tf.data.Dataset``) import their framework only when
called: importing ``hora.store`` never imports an ML framework.
"""

from hora.store.columns import ColumnOps, CsrBatch, decode_image
from hora.store.dataset import ColumnSpec, DatasetInfo, FileInfo
from hora.store.horovod_stores import DBFSLocalStore, FilesystemStore, HDFSStore, LocalStore
from hora.store.layout import StoreLayout
from hora.store.materialize import load_dataset_info, materialize
from hora.store.reader import Reader, make_reader
from hora.store.store import Store
from hora.store.tf_adapter import make_tf_dataset
from hora.store.torch_adapter import TorchBatches, torch_batches

__all__ = [
    "Store",
    "LocalStore",
    "FilesystemStore",
    "HDFSStore",
    "DBFSLocalStore",
    "StoreLayout",
    "ColumnSpec",
    "DatasetInfo",
    "FileInfo",
    "materialize",
    "load_dataset_info",
    "make_reader",
    "Reader",
    "torch_batches",
    "TorchBatches",
    "make_tf_dataset",
    "decode_image",
    "ColumnOps",
    "CsrBatch",
]
