"""Horovod's Store classes as constructors of hora's one :class:`~hora.store.Store`.

``LocalStore(path)``, ``FilesystemStore(url)``, ``HDFSStore(path, host=, port=, user=, kerb_ticket=,
driver=, extra_conf=)`` and ``DBFSLocalStore(path)`` take Horovod's arguments and return a
:class:`hora.store.Store` (the one fsspec-backed implementation, checked writable here, on
the driver). What hora cannot honour is refused with a :class:`~hora.errors.ConfigError`
naming the argument and what to do instead:

* ``train_path`` / ``val_path`` / ``test_path`` / ``runs_path``: hora's layout keeps each
  dataset under ``datasets/<fingerprint>`` and each run under ``runs/<run_id>`` of the store's
  root; give another root to put them elsewhere;
* ``save_runs=False``: hora always keeps a run's checkpoints (a fit resumes and recovers from them);
* ``checkpoint_filename``: checkpoints are one file per epoch (``epoch-000003.ckpt``);
* ``HDFSStore(driver='libhdfs3')`` (pyarrow dropped it) or a ``libhdfs`` that cannot be loaded.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from hora.errors import ConfigError
from hora.store.store import Store

_LAYOUT_ARGS = {
    "train_path": "datasets are kept under datasets/<fingerprint> of the store's root",
    "val_path": "datasets are kept under datasets/<fingerprint> of the store's root",
    "test_path": "hora's estimators materialize no test split",
    "runs_path": "runs are kept under runs/<run_id> of the store's root",
}


def _check_common(cls: str, args: tuple, train_path: Any = None, val_path: Any = None, test_path: Any = None,
                  runs_path: Any = None, save_runs: Any = True, checkpoint_filename: Any = None,
                  **unknown: Any) -> None:
    if args:
        raise ConfigError(f"{cls} got {len(args)} positional argument(s) after prefix_path: pass Horovod's options "
                          "by keyword (storage_options=...)")
    given = {"train_path": train_path, "val_path": val_path, "test_path": test_path, "runs_path": runs_path}
    for name, value in given.items():
        if value is not None:
            raise ConfigError(f"{cls}({name}={value!r}): hora decides where data and runs live ({_LAYOUT_ARGS[name]}); "
                              "drop it, or give the store another prefix_path")
    if save_runs is not True:
        raise ConfigError(f"{cls}(save_runs={save_runs!r}): hora always keeps a run's checkpoints and logs (a fit "
                          "resumes and recovers from them); drop save_runs")
    if checkpoint_filename is not None:
        raise ConfigError(f"{cls}(checkpoint_filename={checkpoint_filename!r}): hora writes one checkpoint file per "
                          "epoch (store.get_checkpoint_filename(epoch) names it); drop checkpoint_filename")
    if unknown:
        raise ConfigError(f"{cls} got unknown argument(s) {sorted(unknown)}; it takes prefix_path, storage_options"
                          + (" and host, port, user, kerb_ticket, driver, extra_conf" if cls == "HDFSStore" else ""))


def _options(cls: str, storage_options: Any) -> dict[str, Any]:
    if storage_options is None:
        return {}
    if not isinstance(storage_options, Mapping):
        raise ConfigError(f"{cls}(storage_options=...) must be a dict of fsspec options, got "
                          f"{type(storage_options).__name__}")
    return dict(storage_options)


def FilesystemStore(prefix_path: str, *args: Any, storage_options: Mapping[str, Any] | None = None,  # noqa: N802
                    **kwargs: Any) -> Store:
    """Horovod's ``FilesystemStore``: a Store at any fsspec URL or local path (``Store.create``).

    Raises:
        ConfigError: an argument hora does not honour (named; see the module docstring).
        StoreError: the store cannot be opened or written.
    """
    _check_common("FilesystemStore", args, **kwargs)
    return Store.create(prefix_path, **_options("FilesystemStore", storage_options))


def LocalStore(prefix_path: str, *args: Any, storage_options: Mapping[str, Any] | None = None,  # noqa: N802
               **kwargs: Any) -> Store:
    """Horovod's ``LocalStore`` (a local path or ``file://`` URL): a Store there.

    Raises:
        ConfigError: an argument hora does not honour (named), or a URL of another filesystem.
        StoreError: the path cannot be written.
    """
    _check_common("LocalStore", args, **kwargs)
    if not isinstance(prefix_path, (str, os.PathLike)):
        raise ConfigError(f"LocalStore(prefix_path=...) must be a path, got {prefix_path!r}")
    path = os.fspath(prefix_path)
    if "://" in path and not path.startswith("file://"):
        raise ConfigError(f"LocalStore(prefix_path={path!r}) is not a local path: use FilesystemStore or "
                          "Store.create for other filesystems")
    return Store.create(path, **_options("LocalStore", storage_options))


def HDFSStore(prefix_path: str, host: str | None = None, port: int | None = None,  # noqa: N802
              user: str | None = None, kerb_ticket: str | None = None, driver: str = "libhdfs",
              extra_conf: Mapping[str, str] | None = None, *args: Any, **kwargs: Any) -> Store:
    """Horovod's ``HDFSStore``: a Store on HDFS through pyarrow's ``libhdfs`` (fsspec's ``hdfs://``).

    ``prefix_path`` is ``hdfs://namenode:8020/path``, ``hdfs:///path`` or ``/path``; ``host``
    and ``port`` override the URL's (default: the namenode of the Hadoop configuration).

    Raises:
        ConfigError: ``driver`` other than ``'libhdfs'``, a ``libhdfs`` pyarrow cannot load
            (names ``driver`` and what it needs), a URL of another scheme, or another
            argument hora does not honour.
        StoreError: the store cannot be reached or written.
    """
    storage_options = kwargs.pop("storage_options", None)
    _check_common("HDFSStore", args, **kwargs)
    if driver != "libhdfs":
        raise ConfigError(f"HDFSStore(driver={driver!r}): hora reaches HDFS through pyarrow, whose only driver is "
                          "'libhdfs' (libhdfs3 was removed from pyarrow); drop driver or pass driver='libhdfs'")
    if not isinstance(prefix_path, str) or not prefix_path:
        raise ConfigError(f"HDFSStore(prefix_path=...) must be an HDFS path, got {prefix_path!r}")
    if "://" in prefix_path and not prefix_path.startswith("hdfs://"):
        raise ConfigError(f"HDFSStore(prefix_path={prefix_path!r}) is not an HDFS URL (hdfs://...)")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or port < 0):
        raise ConfigError(f"HDFSStore(port={port!r}) must be an int >= 0")
    rest = prefix_path[len("hdfs://"):] if prefix_path.startswith("hdfs://") else prefix_path
    netloc, _, path = rest.partition("/") if not rest.startswith("/") else ("", "", rest.lstrip("/"))
    url_host, _, url_port = netloc.partition(":")
    options = _options("HDFSStore", storage_options)
    options["host"] = host or url_host or "default"
    if port or url_port:
        options["port"] = int(port or url_port)
    for name, value in (("user", user), ("kerb_ticket", kerb_ticket), ("extra_conf", extra_conf)):
        if value is not None:
            options[name] = dict(value) if name == "extra_conf" else value
    _check_libhdfs()
    return Store.create("hdfs:///" + path.strip("/"), **options)


def _check_libhdfs() -> None:
    """pyarrow can load ``libhdfs`` here (it needs ``JAVA_HOME``, ``HADOOP_HOME`` and the Hadoop classpath).

    Raises:
        ConfigError: naming ``driver='libhdfs'`` and what is missing.
    """
    import importlib.util

    if importlib.util.find_spec("pyarrow") is None:
        raise ConfigError("HDFSStore(driver='libhdfs') needs pyarrow: pip install pyarrow")
    missing = [v for v in ("JAVA_HOME", "HADOOP_HOME") if not os.environ.get(v)]
    home = os.environ.get("ARROW_LIBHDFS_DIR") or os.path.join(os.environ.get("HADOOP_HOME", ""), "lib", "native")
    if missing and not os.environ.get("ARROW_LIBHDFS_DIR"):
        raise ConfigError(f"HDFSStore(driver='libhdfs'): pyarrow cannot load libhdfs here: {', '.join(missing)} not "
                          "set (libhdfs needs a Java runtime and a Hadoop install; or set ARROW_LIBHDFS_DIR to the "
                          "folder of libhdfs.so)")
    if not os.path.exists(os.path.join(home, "libhdfs.so")):
        raise ConfigError(f"HDFSStore(driver='libhdfs'): no libhdfs.so in {home} (set ARROW_LIBHDFS_DIR to the folder "
                          "that holds it)")


def DBFSLocalStore(prefix_path: str, *args: Any, **kwargs: Any) -> Store:  # noqa: N802
    """Horovod's ``DBFSLocalStore``: a Store on Databricks' DBFS (``/dbfs/...``, ``dbfs:/...``,
    ``file:/dbfs/...`` or ``file:///dbfs/...``), through the ``/dbfs`` mount when there is one.

    Raises:
        ConfigError: a path that is not on DBFS, or an argument hora does not honour.
        StoreError: outside Databricks without ``storage_options`` (``instance=``, ``token=``).
    """
    storage_options = kwargs.pop("storage_options", None)
    _check_common("DBFSLocalStore", args, **kwargs)
    path = os.fspath(prefix_path) if isinstance(prefix_path, os.PathLike) else prefix_path
    for prefix in ("file:///dbfs/", "file:/dbfs/", "/dbfs/", "dbfs:/"):
        if isinstance(path, str) and path.startswith(prefix):
            return Store.create("dbfs:/" + path[len(prefix):].lstrip("/"), **_options("DBFSLocalStore", storage_options))
    raise ConfigError(f"DBFSLocalStore(prefix_path={prefix_path!r}) is not a DBFS path: use /dbfs/..., dbfs:/..., "
                      "file:/dbfs/... or file:///dbfs/...")


#: Horovod's abstract base class: hora has one Store class
AbstractFilesystemStore = Store

__all__ = ["LocalStore", "FilesystemStore", "HDFSStore", "DBFSLocalStore", "AbstractFilesystemStore"]
