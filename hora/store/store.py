"""A Store: one root URL on any fsspec filesystem where hora keeps datasets and runs.

``Store.create(url, **storage_options)`` accepts ``file://`` URLs and bare paths,
``memory://``, ``s3://`` (s3fs), ``gs://`` (gcsfs), ``hdfs://`` (pyarrow + libhdfs),
``abfs://``/``az://`` (adlfs) and ``dbfs:/`` (the ``/dbfs`` mount on Databricks, or
fsspec's DBFS client with ``instance=`` and ``token=``). A missing optional package
raises :class:`~hora.errors.StoreError` naming what to ``pip install``.

The Store pickles to Spark executors, Dask workers and spawned processes: only the
URL and storage options travel, the filesystem is rebuilt on first use. It never
imports an ML framework.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import threading
import uuid
from typing import IO, Any

import fsspec

from hora import settings
from hora.errors import ConfigError, StoreError
from hora.store import retry
from hora.store.horovod_paths import HorovodPaths
from hora.store.layout import StoreLayout, join

logger = logging.getLogger(__name__)

#: Seconds the writability check at :meth:`Store.create` may take before the store is
#: declared unreachable (override with the environment variable ``HORA_STORE_TIMEOUT``).
ENV_STORE_TIMEOUT = "HORA_STORE_TIMEOUT"
DEFAULT_STORE_TIMEOUT_S = settings.default(ENV_STORE_TIMEOUT)

# scheme -> (canonical fsspec protocol, pip package that provides it)
_SCHEMES: dict[str, tuple[str, str | None]] = {
    "file": ("file", None),
    "local": ("file", None),
    "memory": ("memory", None),
    "s3": ("s3", "s3fs"),
    "s3a": ("s3", "s3fs"),
    "gs": ("gs", "gcsfs"),
    "gcs": ("gs", "gcsfs"),
    "hdfs": ("hdfs", "pyarrow"),
    "abfs": ("abfs", "adlfs"),
    "abfss": ("abfs", "adlfs"),
    "az": ("abfs", "adlfs"),
    "dbfs": ("dbfs", None),
}

# protocols whose single-object writes are atomic (a PUT either lands whole or not at all)
_ATOMIC_PUT = {"s3", "gs", "abfs", "memory"}


def store_timeout() -> float:
    """The timeout in seconds for store reachability checks (``HORA_STORE_TIMEOUT`` or the default)."""
    return settings.get(ENV_STORE_TIMEOUT)


def _split_url(url: str) -> tuple[str, str]:
    """(scheme, rest) of a URL; bare paths get scheme ``file``."""
    if "://" in url:
        scheme, rest = url.split("://", 1)
    elif url.startswith("dbfs:/"):
        scheme, rest = "dbfs", url[len("dbfs:") :]
    else:
        return "file", url
    return scheme.lower(), rest


class Store(HorovodPaths):
    """A root location for hora's datasets, checkpoints, logs and models.

    Build one with :meth:`Store.create`. Paths given to the I/O methods are either
    paths from :attr:`layout` (absolute fsspec paths below the root) or paths relative
    to the root; a path with this store's ``scheme://`` prefix is accepted too.

    Attributes:
        url: the URL the store was created from, normalized.
        protocol: the fsspec protocol (``file``, ``memory``, ``s3``, ``gs``, ``hdfs``, ``abfs``, ``dbfs``).
        root: the root as an fsspec path (no scheme).
        storage_options: keyword arguments for the fsspec filesystem.
        layout: the :class:`StoreLayout` of this root.
    """

    def __init__(self, protocol: str, root: str, storage_options: dict[str, Any] | None = None) -> None:
        self.protocol = protocol
        self.root = root
        self.storage_options = dict(storage_options or {})
        self.layout = StoreLayout(root)
        self._fs: fsspec.AbstractFileSystem | None = None
        self._fs_lock = threading.Lock()

    # construction -----------------------------------------------------------------------
    @classmethod
    def create(cls, url: str | os.PathLike, check_writable: bool = True, **storage_options: Any) -> "Store":
        """Open (and create if needed) the store at ``url``.

        Args:
            url: ``file:///path``, a bare path, ``memory://name``, ``s3://bucket/prefix``,
                ``gs://...``, ``hdfs://...``, ``abfs://...``, ``dbfs:/...``.
            check_writable: write, read back and delete a small probe file now, so an
                unreachable or read-only store fails here, on the driver.
            **storage_options: passed to the fsspec filesystem (e.g. ``key``, ``secret``,
                ``client_kwargs={"endpoint_url": ...}`` for S3).

        Raises:
            StoreError: unknown scheme, missing optional package (named in the message),
                or (with ``check_writable``) a store that cannot be written.
            ConfigError: ``url`` is not a string or path.
        """
        if isinstance(url, os.PathLike):
            url = os.fspath(url)
        if not isinstance(url, str) or not url.strip():
            raise ConfigError(f"Store.create needs a URL or path string, got {url!r}")
        url = url.strip()
        scheme, rest = _split_url(url)
        if scheme not in _SCHEMES:
            raise StoreError(
                f"unknown store URL scheme {scheme!r} in {url!r}; supported: "
                + ", ".join(sorted(f"{s}://" for s in _SCHEMES))
            )
        protocol, package = _SCHEMES[scheme]
        if protocol == "file":
            root = os.path.abspath(os.path.expanduser(rest or "."))
        elif protocol == "memory":
            root = "/" + rest.strip("/") if rest.strip("/") else "/hora"
        elif protocol == "dbfs":
            path = "/" + rest.lstrip("/")
            if os.path.isdir("/dbfs") and not storage_options:
                # On Databricks the DBFS root is mounted at /dbfs: use plain file I/O.
                protocol, root = "file", "/dbfs" + path.rstrip("/")
            else:
                root = path.rstrip("/") or "/"
        elif protocol == "hdfs":
            # fsspec's arrow HDFS implementation takes host/port from the URL.
            host_path = rest.split("/", 1)
            netloc = host_path[0]
            root = "/" + (host_path[1].strip("/") if len(host_path) > 1 else "")
            if netloc and "host" not in storage_options:
                host, _, port = netloc.partition(":")
                storage_options = dict(storage_options, host=host)
                if port:
                    storage_options["port"] = int(port)
        else:
            root = rest.strip("/")
            if not root:
                raise StoreError(f"store URL {url!r} names no bucket/container")
        if package is not None:
            _require(package, scheme, url)
        store = cls(protocol, root.rstrip("/") if root != "/" else root, storage_options)
        store.fs  # build the filesystem now: bad options fail here
        if check_writable:
            store.check_writable()
        return store

    @property
    def url(self) -> str:
        """The store root as a URL (``scheme://root``)."""
        return self.url_for(self.root)

    def url_for(self, path: str) -> str:
        """The full URL of a path in this store (for engines that take URLs)."""
        full = self._resolve(path)
        if self.protocol == "file":
            return "file://" + full
        if self.protocol == "hdfs" and self.storage_options.get("host"):
            port = self.storage_options.get("port")
            return f"hdfs://{self.storage_options['host']}{':' + str(port) if port else ''}{full}"
        if self.protocol == "dbfs":
            return f"dbfs:{full}"
        return f"{self.protocol}://{full}"

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Store)
            and (self.protocol, self.root, self.storage_options)
            == (other.protocol, other.root, other.storage_options)
        )

    def __hash__(self) -> int:
        return hash((self.protocol, self.root))

    def __getstate__(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "root": self.root, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["protocol"], state["root"], state["storage_options"])

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem (built lazily, once per process).

        Raises:
            StoreError: the filesystem cannot be built (missing package, bad options).
        """
        if self._fs is None:
            with self._fs_lock:
                if self._fs is None:
                    try:
                        self._fs = retry.single_attempt(
                            fsspec.filesystem(self.protocol, **retry.single_attempt_options(
                                self.protocol, self.storage_options)))
                    except ImportError as exc:
                        package = _SCHEMES.get(self.protocol, (None, None))[1] or str(exc)
                        raise StoreError(
                            f"store {self.url} needs the optional package "
                            f"{package!r}: pip install {package} ({exc})"
                        ) from exc
                    except Exception as exc:  # bad storage options, missing credentials...
                        if self.protocol == "dbfs":
                            raise StoreError(
                                f"cannot open store dbfs:{self.root}: outside Databricks (no /dbfs mount) pass "
                                f"instance= and token= storage options ({type(exc).__name__}: {exc})"
                            ) from exc
                        raise StoreError(
                            f"cannot open store {self.url}: {type(exc).__name__}: {exc}"
                        ) from exc
        return self._fs

    @property
    def is_local(self) -> bool:
        """True when the store is a local (or mounted) file system path."""
        return self.protocol == "file"

    # paths ------------------------------------------------------------------------------
    def _resolve(self, path: str) -> str:
        if not isinstance(path, str) or not path:
            raise ConfigError(f"store path must be a non-empty string, got {path!r}")
        prefix = f"{self.protocol}://"
        if path.startswith(prefix):
            path = path[len(prefix) :]
            if self.protocol == "file":
                path = "/" + path.lstrip("/")
        elif self.protocol == "file" and path.startswith("file:"):
            path = "/" + path[len("file:") :].lstrip("/")
        root = self.root
        if path == root or path.startswith(root.rstrip("/") + "/"):
            full = path
        elif self.protocol in ("file", "memory", "dbfs", "hdfs") and path.startswith("/"):
            raise StoreError(f"path {path!r} is outside the store root {self.url}")
        else:
            full = join(root, path)
        norm = posixpath.normpath(full)
        if full.startswith("/") is False and norm.startswith("/"):
            norm = norm.lstrip("/")
        if norm != root and not norm.startswith(root.rstrip("/") + "/"):
            raise StoreError(f"path {path!r} escapes the store root {self.url}")
        return norm

    # I/O --------------------------------------------------------------------------------
    def _call(self, what: str, path: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` under the Store's retry policy (:mod:`hora.store.retry`): transient
        failures are retried within ``HORA_STORE_RETRY_S``; what still fails becomes a StoreError
        naming the operation and the URL."""
        url = self.url_for(path)
        try:
            return retry.call(what, url, fn, *args, **kwargs)
        except (StoreError, ConfigError):
            raise
        except FileNotFoundError as exc:
            raise StoreError(f"{what}: {url} does not exist") from exc
        except Exception as exc:
            notes = "; ".join(getattr(exc, "__notes__", ()) or ())
            raise StoreError(f"{what} {url} failed: {type(exc).__name__}: {exc}" + (f" ({notes})" if notes else "")) from exc

    def _fresh(self, full: str) -> None:
        # Object-store filesystems (s3fs, gcsfs, adlfs) cache listings per process; another process's
        # writes (a concurrent materialization's lease or commit) would stay invisible. Ask afresh.
        try:
            self.fs.invalidate_cache(full)
        except Exception:  # pragma: no cover - filesystems without a cache
            pass

    def exists(self, path: str) -> bool:
        """Whether a file or folder exists at ``path`` (asked afresh, never from a listing cache).

        Raises:
            StoreError: the store cannot be reached.
        """
        full = self._resolve(path)
        self._fresh(full)
        return bool(self._call("exists", full, self.fs.exists, full))

    def isdir(self, path: str) -> bool:
        """Whether ``path`` is a folder."""
        full = self._resolve(path)
        self._fresh(full)
        return bool(self._call("isdir", full, self.fs.isdir, full))

    def read_bytes(self, path: str) -> bytes:
        """The whole content of a file.

        Raises:
            StoreError: the file does not exist or cannot be read.
        """
        full = self._resolve(path)
        return self._call("read", full, self.fs.cat_file, full)

    def write_bytes(self, path: str, data: bytes, sync: bool = True) -> None:
        """Write a whole file atomically: readers see the old content or the new, never a part.

        Local and HDFS-like stores write a temporary sibling and rename it over the
        target; object stores (S3, GCS, Azure) and ``memory://`` do one single-object PUT.
        ``sync=False``: a local file is not flushed to the disk before its rename (a small
        record whose loss in a power cut is harmless).

        Raises:
            StoreError: the write fails.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ConfigError(f"write_bytes needs bytes, got {type(data).__name__}")
        full = self._resolve(path)
        parent = posixpath.dirname(full)
        if self.protocol in _ATOMIC_PUT:
            self._call("write", full, self.fs.pipe_file, full, bytes(data))
            return
        if self.protocol == "file":
            def _fill(tmp: str) -> None:
                with open(tmp, "wb") as fh:
                    fh.write(data)
                    if sync:
                        fh.flush()
                        os.fsync(fh.fileno())

            self._local_replace("write", full, _fill)
            return
        tmp = join(parent, f".{posixpath.basename(full)}.tmp-{uuid.uuid4().hex[:12]}")

        def _generic() -> None:
            self.fs.makedirs(parent, exist_ok=True)
            self.fs.pipe_file(tmp, bytes(data))
            if self.fs.exists(full):
                self.fs.rm(full)
            self.fs.mv(tmp, full)

        self._call("write", full, _generic)

    def read_json(self, path: str) -> Any:
        """Parse a JSON file.

        Raises:
            StoreError: missing file or invalid JSON (the path is named).
        """
        raw = self.read_bytes(path)
        try:
            return json.loads(raw.decode("utf-8"))
        except ValueError as exc:
            raise StoreError(f"{self.url_for(path)} is not valid JSON: {exc}") from exc

    def write_json(self, path: str, obj: Any) -> None:
        """Write ``obj`` as JSON, atomically (see :meth:`write_bytes`)."""
        self.write_bytes(path, json.dumps(obj, indent=1, sort_keys=True).encode("utf-8"))

    def listdir(self, path: str) -> list[str]:
        """Sorted full paths of the entries directly inside a folder ([] when it does not exist),
        listed afresh (what other processes wrote is seen).

        Raises:
            StoreError: the store cannot be reached.
        """
        full = self._resolve(path)
        self._fresh(full)

        def _ls() -> list[str]:
            try:
                entries = self.fs.ls(full, detail=False)
            except FileNotFoundError:
                return []
            out = []
            for entry in entries:
                entry = entry.rstrip("/")
                if self.protocol == "memory" and not entry.startswith("/"):
                    entry = "/" + entry
                if entry != full:
                    out.append(entry)
            return sorted(out)

        return self._call("list", full, _ls)

    def makedirs(self, path: str) -> None:
        """Create a folder and its parents (a no-op on object stores without folders)."""
        full = self._resolve(path)
        if self.protocol in ("s3", "gs", "abfs"):
            # no folders to make; and s3fs's makedirs asks whether the bucket exists and, when that
            # question meets a transient error, tries to create the bucket (a permanent failure)
            return
        self._call("makedirs", full, self.fs.makedirs, full, exist_ok=True)

    def rm(self, path: str, recursive: bool = False, missing_ok: bool = True) -> None:
        """Remove a file, or a folder with ``recursive=True``.

        Raises:
            StoreError: it exists and cannot be removed, or is missing and ``missing_ok`` is False.
        """
        full = self._resolve(path)
        if not self.exists(full):
            if missing_ok:
                return
            raise StoreError(f"rm: {self.url_for(full)} does not exist")
        self._call("rm", full, self.fs.rm, full, recursive=recursive)
        if self.protocol == "file" and recursive and os.path.isdir(full):  # pragma: no cover - races
            import shutil

            shutil.rmtree(full, ignore_errors=True)

    def mv(self, src: str, dst: str) -> None:
        """Move a file or folder within the store (a rename on local disks, copy+delete on object stores)."""
        s, d = self._resolve(src), self._resolve(dst)
        if self.protocol == "file":
            def _local_mv() -> None:
                os.makedirs(posixpath.dirname(d), exist_ok=True)
                os.replace(s, d)

            self._call("move", s, _local_mv)
            return
        self._call("move", s, self.fs.mv, s, d, recursive=True)

    def upload(self, local_path: str, path: str) -> None:
        """Copy the local file ``local_path`` to ``path`` in the store, whole and retried as one
        operation (object stores: one PUT or multipart upload; local: a rename of a temporary copy).

        Raises:
            StoreError: the upload fails (the URL named).
        """
        full = self._resolve(path)
        if self.protocol == "file":
            import shutil

            self._local_replace("upload", full, lambda tmp: shutil.copyfile(local_path, tmp))
            return
        self._call("upload", full, self.fs.put_file, local_path, full)

    def _local_replace(self, what: str, full: str, fill: Any) -> None:
        """Write a local file atomically: ``fill(tmp)`` writes a temporary sibling, which is then
        renamed over ``full`` (readers see the old content or the new, never a part)."""
        parent = posixpath.dirname(full)
        tmp = join(parent, f".{posixpath.basename(full)}.tmp-{uuid.uuid4().hex[:12]}")

        def _local() -> None:
            os.makedirs(parent, exist_ok=True)
            fill(tmp)
            os.replace(tmp, full)

        try:
            self._call(what, full, _local)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def size(self, path: str) -> int:
        """Size of a file in bytes."""
        full = self._resolve(path)
        return int(self._call("size", full, self.fs.size, full))

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> IO:
        """Open a file (a file object usable in ``with``). Writing does not create parents on
        every filesystem: call :meth:`makedirs` first for local stores.

        Raises:
            StoreError: it cannot be opened.
        """
        full = self._resolve(path)
        if "w" in mode and self.protocol == "file":
            os.makedirs(posixpath.dirname(full), exist_ok=True)
        if mode == "rb" and not kwargs and self.protocol != "file":
            # a remote read resumes at its offset after a transient failure mid-file
            size = self.size(full)
            return retry.ResumableReader(lambda: self.fs.open(full, "rb"), size, "read", self.url_for(full))
        return self._call("open", full, self.fs.open, full, mode, **kwargs)

    # checks -----------------------------------------------------------------------------
    def check_writable(self, timeout: float | None = None) -> None:
        """Write, read back and delete a probe file below the root, within ``timeout`` seconds.

        Raises:
            StoreError: the store is unreachable, read-only, or did not answer in time
                (the message names the URL and the timeout).
        """
        timeout = store_timeout() if timeout is None else timeout
        probe = join(self.root, f"_hora_write_check-{uuid.uuid4().hex[:12]}")
        payload = b"hora write check"

        def _probe() -> None:
            if self.protocol == "file":
                os.makedirs(self.root, exist_ok=True)
            self.write_bytes(probe, payload)
            got = self.read_bytes(probe)
            if got != payload:
                raise StoreError(f"store {self.url} returned different bytes than written to {probe}")
            self.rm(probe)

        result: dict[str, BaseException | None] = {}

        def _run() -> None:
            try:
                with retry.limited(timeout / 3):  # leave time to report the store's own error
                    _probe()
                result["error"] = None
            except BaseException as exc:  # handed to the caller below
                result["error"] = exc

        # a daemon thread, so a store that never answers cannot hold the interpreter at exit
        thread = threading.Thread(target=_run, name="hora-store-check", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive() or "error" not in result:
            raise StoreError(
                f"store {self.url} did not answer a write check within {timeout:.0f} s "
                f"(unreachable? set {ENV_STORE_TIMEOUT} to wait longer)"
            )
        exc = result["error"]
        if exc is None:
            return
        if isinstance(exc, StoreError):
            raise StoreError(f"store {self.url} is not writable: {exc}") from exc
        raise StoreError(f"store {self.url} is not writable: {type(exc).__name__}: {exc}") from exc

    # checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self, run_id: str, epoch: int, data: bytes) -> str:
        """Write the checkpoint of ``epoch`` atomically; returns its path.

        Raises:
            StoreError: the write fails.
        """
        from hora.store import integrity

        path = self.layout.checkpoint_path(run_id, epoch)
        integrity.save_checkpoint(self, path, data)  # with its checksum record
        logger.debug("saved checkpoint %s (%d bytes)", path, len(data))
        return path

    def list_checkpoints(self, run_id: str) -> list[int]:
        """Epochs that have a checkpoint, ascending."""
        epochs = []
        for entry in self.listdir(self.layout.checkpoint_dir(run_id)):
            epoch = StoreLayout.parse_checkpoint_epoch(entry)
            if epoch is not None:
                epochs.append(epoch)
        return sorted(epochs)

    def latest_checkpoint(self, run_id: str) -> tuple[int, bytes] | None:
        """``(epoch, bytes)`` of the newest checkpoint of a run whose bytes match their recorded
        checksum, or None when there is none; a damaged newer one is skipped with a warning
        naming it (a checkpoint without a record, written before hora recorded them, is read
        unverified)."""
        from hora.errors import DataError
        from hora.store import integrity

        for epoch in reversed(self.list_checkpoints(run_id)):
            path = self.layout.checkpoint_path(run_id, epoch)
            try:
                return epoch, integrity.read_checkpoint(self, path, f"checkpoint {self.url_for(path)} of run {run_id}")
            except DataError as exc:
                logger.warning("%s; resuming from an earlier checkpoint", exc)
        return None


def _require(package: str, scheme: str, url: str) -> None:
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise StoreError(f"store URL {url!r} ({scheme}://) needs the optional package {package!r}: pip install {package}")


__all__ = ["Store", "DEFAULT_STORE_TIMEOUT_S", "ENV_STORE_TIMEOUT", "store_timeout"]
