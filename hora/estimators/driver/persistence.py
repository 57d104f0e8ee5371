"""Persisting estimators and fitted models: JSON metadata plus named side files, on any Store.

Layout of a saved fitted model (both faces; the Spark face adds Spark's own
``metadata/`` folder next to it so ``DefaultParamsReader`` and ``PipelineModel.load``
find the class)::

    <dir>/hora_model.json     format, framework name, JSON-able attributes
    <dir>/model.pkl           the model definition (cloudpickle)   } written by the
    <dir>/weights.pt          the weights (framework format)       } framework's codec
    <dir>/objects.pkl         non-JSON params (callables, optimizer...), cloudpickled

A saved estimator has ``hora_estimator.json`` and ``objects.pkl``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from hora.errors import StoreError
from hora.estimators.spec import freeze, thaw

logger = logging.getLogger(__name__)

FORMAT = 1
MODEL_META = "hora_model.json"
ESTIMATOR_META = "hora_estimator.json"
OBJECTS = "objects.pkl"


def open_store(url: str) -> Any:
    """A :class:`hora.store.Store` rooted at ``url`` (a path or any Store URL)."""
    from hora.store import Store

    return Store.create(url, check_writable=False)


def class_path(obj: Any) -> str:
    """``module:QualName`` of an object's class."""
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _json_safe(meta: dict[str, Any]) -> dict[str, Any]:
    try:
        json.dumps(meta)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"metadata is not JSON-serializable: {exc}") from exc
    return meta


def save_fitted(url: str, codec: Any, model: Any, meta: dict[str, Any], objects: dict[str, Any] | None = None,
                overwrite: bool = True) -> None:
    """Write a fitted model to the folder ``url`` with the framework's ``codec``.

    Raises:
        StoreError: the folder exists and ``overwrite`` is False, or writing fails.
    """
    store = open_store(url)
    if not overwrite and store.exists(MODEL_META):
        raise StoreError(f"{store.url} already holds a saved model; pass overwrite=True to replace it")
    files = codec.serialize(model)
    for name, data in files.items():
        store.write_bytes(name, data)
    store.write_bytes(OBJECTS, freeze(objects or {}))
    # the metadata goes last: a folder with it is complete
    store.write_json(
        MODEL_META,
        _json_safe({"format": FORMAT, "framework": codec.name, "files": sorted(files), **meta}),
    )
    logger.info("saved %s model to %s", codec.name, store.url)


def load_fitted(url: str) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    """Read a fitted model written by :func:`save_fitted`: ``(codec, model, meta, objects)``.

    Raises:
        StoreError: no saved model there, an unsupported format, an unknown framework, or unreadable files.
    """
    from hora.errors import ConfigError
    from hora.estimators.framework import get_framework

    store = open_store(url)
    if not store.exists(MODEL_META):
        raise StoreError(f"{store.url} holds no saved hora model ({MODEL_META} is missing)")
    meta = store.read_json(MODEL_META)
    if meta.get("format") != FORMAT:
        raise StoreError(f"{store.url}: saved model format {meta.get('format')!r} is not supported (expected {FORMAT})")
    try:
        codec = get_framework(meta.get("framework", "")).codec
    except ConfigError as exc:
        raise StoreError(f"{store.url}: {exc}") from exc
    files = {name: store.read_bytes(name) for name in meta.get("files", [])}
    model = codec.deserialize(files)
    objects = thaw(store.read_bytes(OBJECTS)) if store.exists(OBJECTS) else {}
    return codec, model, meta, objects


def save_objects(url: str, meta: dict[str, Any], objects: dict[str, Any], meta_name: str = ESTIMATOR_META) -> None:
    """Write JSON ``meta`` and pickled ``objects`` (an unfitted estimator's params) to ``url``."""
    store = open_store(url)
    store.write_bytes(OBJECTS, freeze(objects))
    store.write_json(meta_name, _json_safe({"format": FORMAT, **meta}))


def load_objects(url: str, meta_name: str = ESTIMATOR_META) -> tuple[dict[str, Any], dict[str, Any]]:
    """Inverse of :func:`save_objects`: ``(meta, objects)``.

    Raises:
        StoreError: nothing saved there.
    """
    store = open_store(url)
    if not store.exists(meta_name):
        raise StoreError(f"{store.url} holds no saved hora estimator ({meta_name} is missing)")
    meta = store.read_json(meta_name)
    objects = thaw(store.read_bytes(OBJECTS)) if store.exists(OBJECTS) else {}
    return meta, objects


__all__ = ["save_fitted", "load_fitted", "save_objects", "load_objects", "open_store", "class_path"]
