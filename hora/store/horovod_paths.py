"""The Store methods Horovod's users call (``get_checkpoint_path(run_id)``, ``exists``, ``read``, ...).

:class:`HorovodPaths` is a mixin of :class:`hora.store.Store`: each method is a thin view of
the Store's own layout (:mod:`hora.store.layout`) and I/O, returning URLs as Horovod's
stores did (``file:///tmp/store/runs/run01/checkpoints``). Where hora's layout differs
from Horovod's, the method says where hora keeps the thing:

* a run's checkpoints are one file per epoch in ``get_checkpoint_path(run_id)``
  (``epoch-000003.ckpt``; ``get_checkpoint_filename(3)`` names one);
* prepared data lives under ``datasets/<fingerprint>``; ``get_train_data_path(idx)``
  is the train split of the dataset ``util.prepare_data`` prepared as index ``idx``
  (None: the latest prepared or trained on), found through :mod:`hora.store.prepared`.
"""

from __future__ import annotations

import posixpath
from typing import Any

from hora.errors import ConfigError, DataError
from hora.store.layout import CHECKPOINT_PREFIX, CHECKPOINT_SUFFIX, join

#: the folder of the prepared-dataset index files (see :mod:`hora.store.prepared`)
PREPARED = "prepared"


def prepared_index_path(root: str, idx: int | None) -> str:
    """The index file of prepared dataset ``idx`` below ``root`` (None: ``latest.json``, the last one).

    Raises:
        ConfigError: ``idx`` is not an int >= 0 or None.
    """
    if idx is None:
        return join(root, PREPARED, "latest.json")
    if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
        raise ConfigError(f"dataset_idx must be an int >= 0 or None, got {idx!r}")
    return join(root, PREPARED, f"{idx}.json")


class HorovodPaths:
    """Horovod's Store methods over hora's one Store (mixed into :class:`hora.store.Store`)."""

    # (provided by the Store)
    layout: Any
    url_for: Any
    exists: Any
    read_bytes: Any
    write_bytes: Any
    read_json: Any
    root: str

    def get_runs_path(self) -> str:
        """The URL of the folder holding every run."""
        return self.url_for(self.layout.runs_dir())

    def get_run_path(self, run_id: str) -> str:
        """The URL of one run's folder (checkpoints, logs, history, model)."""
        return self.url_for(self.layout.run_dir(run_id))

    def get_checkpoint_path(self, run_id: str) -> str:
        """The URL of the folder holding a run's checkpoints (one file per epoch); a fit with this
        ``run_id`` resumes from the last one."""
        return self.url_for(self.layout.checkpoint_dir(run_id))

    def get_checkpoints(self, run_id: str, suffix: str = CHECKPOINT_SUFFIX) -> list[str]:
        """URLs of a run's checkpoint files, oldest first."""
        return [self.url_for(p) for p in self.listdir(self.layout.checkpoint_dir(run_id)) if p.endswith(suffix)]

    def get_logs_path(self, run_id: str) -> str:
        """The URL of a run's logs folder (TensorBoard event files and the like)."""
        return self.url_for(self.layout.logs_dir(run_id))

    def get_logs_subdir(self) -> str:
        """The logs folder's name inside a run's folder."""
        return posixpath.basename(self.layout.logs_dir("r"))

    def get_checkpoint_filename(self, epoch: int | None = None) -> str:
        """The basename of the checkpoint file of ``epoch``; without one, the pattern every
        checkpoint file of a run matches (``epoch-*.ckpt``)."""
        if epoch is None:
            return f"{CHECKPOINT_PREFIX}*{CHECKPOINT_SUFFIX}"
        return posixpath.basename(self.layout.checkpoint_path("r", epoch))

    def get_train_data_path(self, idx: int | None = None) -> str:
        """The URL of the train split of the dataset prepared as index ``idx`` (None: the latest).

        Raises:
            DataError: no dataset was prepared under that index (names the store path).
        """
        return self.url_for(self.layout.train_dir(self.prepared_fingerprint(idx)))

    def get_val_data_path(self, idx: int | None = None) -> str:
        """The URL of the validation split of the dataset prepared as index ``idx`` (None: the latest).

        Raises:
            DataError: no dataset was prepared under that index (names the store path).
        """
        return self.url_for(self.layout.val_dir(self.prepared_fingerprint(idx)))

    def prepared_fingerprint(self, idx: int | None = None) -> str:
        """The fingerprint of the dataset prepared as index ``idx`` (None: the latest prepared or trained
        on), as recorded by :func:`hora.store.prepared.record`.

        Raises:
            DataError: nothing was recorded under that index (names the index file's URL).
            ConfigError: a bad ``idx``.
        """
        path = prepared_index_path(self.root, idx)
        if not self.exists(path):
            what = "dataset_idx=None (the latest)" if idx is None else f"dataset_idx={idx}"
            raise DataError(f"no dataset was prepared in {self.url_for(self.root)} for {what}: {self.url_for(path)} "
                            "does not exist; run util.prepare_data(...) or a fit on a DataFrame with this store first")
        fingerprint = self.read_json(path).get("fingerprint")
        if not isinstance(fingerprint, str):
            raise DataError(f"{self.url_for(path)} names no dataset (no 'fingerprint'); prepare the data again")
        return fingerprint

    def read(self, path: str) -> bytes:
        """The content of a file (Horovod's name for :meth:`read_bytes`)."""
        return self.read_bytes(path)

    def write_text(self, path: str, text: str) -> None:
        """Write ``text`` (UTF-8) to a file, atomically."""
        self.write_bytes(path, text.encode("utf-8"))

    def is_parquet_dataset(self, path: str) -> bool:
        """Whether ``path`` holds a Parquet dataset (a Parquet file, or a folder of them) pyarrow can open."""
        import pyarrow.parquet as pq

        full = self._resolve(path)  # type: ignore[attr-defined]
        if not self.exists(full):
            return False
        try:
            pq.ParquetDataset(full, filesystem=self.fs)  # type: ignore[attr-defined]
        except Exception:  # not Parquet, or unreadable: Horovod answers False
            return False
        return True

    listdir: Any


__all__ = ["HorovodPaths", "prepared_index_path", "PREPARED"]
