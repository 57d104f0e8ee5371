"""torch's distributed checkpoint (DCP) written and read through a hora Store.

:class:`StoreWriter` and :class:`StoreReader` are DCP's file-system writer and reader with
every file operation done by the :class:`~hora.store.Store`, so each is retried under the
Store's one retry policy (``HORA_STORE_RETRY_S``) like any other Store operation; torch's
``FsspecWriter`` wrote through the filesystem directly, and a transient S3 error failed the
checkpoint. A shard file is written to a local temporary file, then put in place whole (one
retried upload, or a rename on a local store): a failed attempt never leaves a part; its
checksum is taken as it is written. The coordinator records every file's
size and checksum in the folder's
``.hora-checksums.json`` (:data:`hora.store.verify.DCP_CHECKSUMS`) after ``.metadata``; the
reader checks each file it reads against it and raises :class:`~hora.errors.DataError` naming
the file and the run when one was truncated or changed (a folder without the record, written
before hora recorded checksums, is read unverified).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import posixpath
import tempfile
import uuid
from typing import Any, Iterator

from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader, FileSystemWriter, _StorageInfo

from hora.errors import DataError
from hora.store import integrity
from hora.store.layout import join
from hora.store.verify import DCP_CHECKSUMS


def _run_of(path: str) -> str:
    """The run a path of the layout belongs to (``.../runs/<run_id>/checkpoints/...``), for messages."""
    parts = path.split("/")
    return parts[parts.index("runs") + 1] if "runs" in parts[:-1] else "?"


class StoreFileSystem(FileSystemBase):
    """DCP's file-system operations on a :class:`~hora.store.Store` (each one retried by the Store)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        #: ``{file name: {"checksum", "size"}}`` of the files this process wrote
        self.written: dict[str, dict[str, Any]] = {}
        self._expected: dict[str, dict[str, Any]] | None = None

    # writing ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[io.IOBase]:
        path = str(path)
        if mode == "rb":
            yield io.BytesIO(self._read_checked(path))  # type: ignore[misc]
            return
        if mode != "wb":
            raise ValueError(f"unsupported mode {mode!r}")
        store = self.store
        if store.is_local:  # a temporary sibling renamed over the target
            os.makedirs(posixpath.dirname(path), exist_ok=True)
            tmp = join(posixpath.dirname(path), f".{posixpath.basename(path)}.tmp-{uuid.uuid4().hex[:12]}")
        else:  # spooled locally, then uploaded whole (one retried operation)
            fd, tmp = tempfile.mkstemp(prefix="hora-dcp-")
            os.close(fd)
        sink = integrity.HashingFile(open(tmp, "wb"))  # (torch writes tensors in large writes: hashed alongside)
        try:
            yield sink  # type: ignore[misc]
            sink.close()
            if store.is_local:
                store.mv(tmp, path)
            else:
                store.upload(tmp, path)
            self.written[posixpath.basename(path)] = {"checksum": sink.checksum, "size": sink.size}
        finally:
            sink.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    # reading ------------------------------------------------------------------------------
    def _read_checked(self, path: str) -> bytes:
        data = self.store.read_bytes(path)
        name = posixpath.basename(path)
        if self._expected is None:
            record = join(posixpath.dirname(path), DCP_CHECKSUMS)
            if self.store.exists(record):
                try:
                    self._expected = dict(json.loads(self.store.read_bytes(record))["files"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise DataError(f"the checksum record {self.store.url_for(record)} of run {_run_of(path)} is "
                                    f"unreadable ({type(exc).__name__}: {exc})") from exc
            else:
                integrity.unverified("distributed checkpoint", self.store.url_for(posixpath.dirname(path)))
                self._expected = {}
        rec = self._expected.get(name)
        if rec is not None:
            integrity.check_bytes(data, rec.get("checksum"), rec.get("size"),
                                  f"shard {self.store.url_for(path)} of run {_run_of(path)}")
        return data

    # the rest -----------------------------------------------------------------------------
    def concat_path(self, path: Any, suffix: str) -> str:
        return join(str(path), suffix)

    def init_path(self, path: Any) -> str:
        return str(path)

    def rename(self, path: Any, new_path: Any) -> None:
        self.store.mv(str(path), str(new_path))
        old, new = posixpath.basename(str(path)), posixpath.basename(str(new_path))
        if old in self.written:
            self.written[new] = self.written.pop(old)

    def mkdir(self, path: Any) -> None:
        self.store.makedirs(str(path))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True

    def exists(self, path: Any) -> bool:
        return self.store.exists(str(path))

    def rm_file(self, path: Any) -> None:
        self.store.rm(str(path))

    def ls(self, path: Any) -> list[str]:
        return self.store.listdir(str(path))


@dataclasses.dataclass
class _CheckedInfo(_StorageInfo):
    """A write result's storage info with its file's checksum, on its way to the coordinator."""

    checksum: str | None = None
    file_size: int | None = None


class StoreWriter(FileSystemWriter):
    """DCP's writer into ``path`` of ``store`` (one file per rank), through the Store's retried operations."""

    def __init__(self, store: Any, path: str) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=False, overwrite=True)
        self.store_fs = StoreFileSystem(store)
        self.fs = self.store_fs  # type: ignore[assignment]  # (torch's writer calls only FileSystemBase's methods)
        self.path = self.folder = path

    def write_data(self, plan: Any, planner: Any) -> Any:
        fut = super().write_data(plan, planner)
        results = []
        for wr in fut.wait():
            info = wr.storage_data
            rec = self.store_fs.written.get(info.relative_path, {})
            results.append(dataclasses.replace(wr, storage_data=_CheckedInfo(
                info.relative_path, info.offset, info.length, info.transform_descriptors,
                checksum=rec.get("checksum"), file_size=rec.get("size"))))
        from torch.futures import Future

        out: Future = Future()
        out.set_result(results)
        return out

    def finish(self, metadata: Any, results: list[list[Any]]) -> None:
        files: dict[str, dict[str, Any]] = {}
        plain = []
        for wr_list in results:
            row = []
            for wr in wr_list:
                info = wr.storage_data
                if isinstance(info, _CheckedInfo):
                    files[info.relative_path] = {"checksum": info.checksum, "size": info.file_size}
                    info = _StorageInfo(info.relative_path, info.offset, info.length, info.transform_descriptors)
                row.append(dataclasses.replace(wr, storage_data=info))
            plain.append(row)
        super().finish(metadata, plain)  # .metadata (torch's own format), written and renamed through the Store
        meta = self.store_fs.written.get(".metadata")
        if meta is not None:
            files[".metadata"] = meta
        # (not flushed to a local disk on its own: lost in a power cut, the folder is read unverified)
        self.store_fs.store.write_bytes(join(self.folder, DCP_CHECKSUMS),
                                  json.dumps({"files": files}, sort_keys=True).encode("utf-8"), sync=False)


class StoreReader(FileSystemReader):
    """DCP's reader of ``path`` in ``store``: each file read whole through the Store (retried) and
    checked against the folder's checksum record."""

    def __init__(self, store: Any, path: str) -> None:
        super().__init__(path)
        self.fs = StoreFileSystem(store)  # type: ignore[assignment]  # (as in StoreWriter)
        self.path = path


def data_error_in(exc: BaseException) -> DataError | None:
    """The :class:`DataError` a failed ``dcp.save``/``dcp.load`` carries (in DCP's per-rank
    failures or in the exception's causes), or None."""
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        if isinstance(cur, DataError):
            return cur
        for failure in (getattr(cur, "failures", None) or {}).values():
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, DataError):
                return inner
        cur = cur.__cause__ or cur.__context__
    return None


__all__ = ["StoreFileSystem", "StoreWriter", "StoreReader", "data_error_in"]
