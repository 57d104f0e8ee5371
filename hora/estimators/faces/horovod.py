"""What the Spark face adds for Horovod's users: ``fit_on_parquet``, models built by hand, resume hooks.

* :class:`HorovodEstimatorMethods` (mixed into every Spark estimator): ``fit_on_parquet(dataset_idx=None,
  params=None)`` trains on data that ``util.prepare_data`` (or an earlier fit) materialized in the
  store, without a DataFrame; ``_load_checkpoint(run_id)`` (Torch), ``_read_checkpoint(run_id)``
  (Lightning) and ``_load_model_from_checkpoint(run_id)`` (Keras), Horovod's names, read a run's
  last checkpoint on the driver when a fit with that ``run_id`` resumes it.
* :func:`model_kwargs` turns Horovod's model keywords (``TorchModel(history=, model=,
  feature_columns=, label_columns=, input_shapes=, optimizer=, run_id=, _metadata=)``,
  ``KerasModel(..., custom_objects=)``) into the model's Params; such a model transforms as
  Horovod's did: one ``<label>__output`` column per label, multi-valued outputs as ML vectors,
  the per-row output shapes learned from a forward pass on the first rows it transforms.
* :func:`vector_labels`: a model fitted on ML-vector labels writes its multi-valued predictions
  as ML vectors, as Horovod's did (a one-hot ``label_vec`` gives a vector ``label_prob``).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from hora.errors import ConfigError, DataError
from hora.estimators.data.columns import rows_per_forward

logger = logging.getLogger(__name__)

#: the name Horovod's estimator of each framework reads a run's checkpoint with
CHECKPOINT_READERS = {"torch": "_load_checkpoint", "lightning": "_read_checkpoint",
                      "keras": "_load_model_from_checkpoint"}
#: Horovod's model keywords hora keeps for the getters only (transform does not use them)
KEPT = ("optimizer", "loss", "loss_constructors", "custom_objects", "_metadata")


class HorovodEstimatorMethods:
    """``fit_on_parquet`` and the checkpoint readers of a Spark estimator (see the module docstring)."""

    def fit_on_parquet(self, dataset_idx: int | None = None, params: dict | None = None) -> Any:
        """Train on the dataset ``util.prepare_data`` prepared as ``dataset_idx`` (None: the one prepared
        or trained on last) in the estimator's store, without a DataFrame; returns the fitted model.

        ``params`` (a Param map) overrides the estimator's Params for this fit, as in ``fit``.

        Raises:
            DataError: no such prepared dataset in the store (names its path), or a column the
                estimator names that it does not hold.
            ConfigError, WorkerFailedError: as ``fit``.
        """
        if params:
            return self.copy(params).fit_on_parquet(dataset_idx=dataset_idx)  # type: ignore[attr-defined]
        from hora.estimators.driver import fit as core
        from hora.store import prepared

        config = self._config()  # type: ignore[attr-defined]
        info = prepared.find(config.store, dataset_idx)
        spark = _active_spark()
        result = core.fit(None, config, self.framework, spark=spark, dataset=info,  # type: ignore[attr-defined]
                          load_checkpoint=self._checkpoint_reader())
        return self.model_class._from_result(result, config)  # type: ignore[attr-defined]

    def _checkpoint_reader(self) -> Any:
        """The bound method reading a run's last checkpoint (looked up by name, so it can be replaced)."""
        return getattr(self, CHECKPOINT_READERS.get(self.framework.name, "_load_checkpoint"))  # type: ignore

    def _latest_checkpoint(self, run_id: str) -> tuple[int, bytes] | None:
        """``(epoch, bytes)`` of the last checkpoint of ``run_id`` in the estimator's store (None: none)."""
        return self.getOrDefault("store").latest_checkpoint(run_id)  # type: ignore[attr-defined]

    def _load_checkpoint(self, run_id: str) -> tuple[int, bytes] | None:
        """Horovod's Torch name for :meth:`_latest_checkpoint`."""
        return self._latest_checkpoint(run_id)

    def _read_checkpoint(self, run_id: str) -> tuple[int, bytes] | None:
        """Horovod's Lightning name for :meth:`_latest_checkpoint`."""
        return self._latest_checkpoint(run_id)

    def _load_model_from_checkpoint(self, run_id: str) -> tuple[int, bytes] | None:
        """Horovod's Keras name for :meth:`_latest_checkpoint`."""
        return self._latest_checkpoint(run_id)


class HorovodModelMethods:
    """Horovod's getters of a fitted or hand-built Spark model (see the module docstring)."""

    _horovod: dict[str, Any]
    getOrDefault: Any

    def getFeatureColumns(self) -> list[Any]:  # noqa: N802 (Horovod's name)
        """The feature columns (Horovod's name for ``getFeatureCols``)."""
        return self.getOrDefault("feature_cols")

    def getLabelColumns(self) -> list[str]:  # noqa: N802 (Horovod's name)
        """The label columns (Horovod's name for ``getLabelCols``)."""
        return self.getOrDefault("label_cols")

    def getOptimizer(self) -> Any:  # noqa: N802 (Horovod's name)
        """The optimizer a model built by hand was given (Horovod's keyword; None otherwise)."""
        return self._horovod.get("optimizer")

    def getLoss(self) -> Any:  # noqa: N802 (Horovod's name)
        """The loss a model built by hand was given (Horovod's keyword; None otherwise)."""
        return self._horovod.get("loss")

    def getLossConstructors(self) -> Any:  # noqa: N802 (Horovod's name)
        """The loss constructors a model built by hand was given (Horovod's keyword; None otherwise)."""
        return self._horovod.get("loss_constructors")

    def getCustomObjects(self) -> Any:  # noqa: N802 (Horovod's name)
        """The Keras custom objects a model built by hand was given (Horovod's keyword; None otherwise)."""
        return self._horovod.get("custom_objects")

    def _get_metadata(self) -> Any:
        """The column metadata a model built by hand was given (Horovod's ``_metadata``; None otherwise)."""
        return self._horovod.get("_metadata")


def _active_spark() -> Any:
    """The active SparkSession (classic or Connect), or None: ``fit_on_parquet`` then trains on local processes."""
    from hora import _spark

    try:
        return _spark.active_session()
    except ConfigError:
        return None


def model_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(the model's Params, Horovod's kept objects)`` from a model constructor's keywords: Horovod's
    ``feature_columns`` / ``label_columns`` become ``feature_cols`` / ``label_cols``; with any of
    Horovod's keywords, the outputs default to ``<label>__output`` columns and ML vectors.

    Raises:
        ConfigError: a column list given under both names.
    """
    out = dict(kwargs)
    horovod = False
    for old, new in (("feature_columns", "feature_cols"), ("label_columns", "label_cols")):
        if old in out:
            if out.get(new) is not None:
                raise ConfigError(f"give {new} or Horovod's {old}, not both")
            out[new] = out.pop(old)
            horovod = True
    kept = {k: out.pop(k) for k in KEPT if k in out}
    horovod = horovod or bool(kept)
    if horovod:
        labels = out.get("label_cols") or []
        if out.get("output_cols") is None and labels:
            out["output_cols"] = [f"{c}__output" for c in labels]
        out.setdefault("vector_outputs", True)
    return out, kept


def vector_labels(df: Any, label_cols: Sequence[str]) -> bool:
    """Whether a label column of the Spark DataFrame ``df`` holds ML vectors (its predictions are then
    ML vectors too, as in Horovod)."""
    from pyspark.ml.linalg import VectorUDT

    fields = {f.name: f.dataType for f in df.schema.fields}
    return any(isinstance(fields.get(c), VectorUDT) for c in label_cols)


def infer_output_shapes(codec: Any, model: Any, source: Any, feature_cols: Any, input_shapes: Any,
                        n_outputs: int) -> list[tuple[int, ...]]:
    """The per-row shape of each output of a model built by hand, from a forward pass on the first rows of
    the frame of ``source`` (its :class:`~hora.store.sources.Source`, decided at the top of ``transform``).

    Raises:
        DataError: the frame is empty or lacks a feature column; the model gives another number of outputs.
    """
    from hora.estimators.data.frames import Features, sample_numpy

    features = Features.parse(feature_cols)
    sample = sample_numpy(source, features.columns, roles=[("feature_cols", c) for c in features.columns])
    inputs = features.inputs(sample)
    rows = rows_per_forward(inputs, input_shapes) or len(inputs[0])
    outs = codec.predict(model, [a[:rows] for a in inputs], input_shapes, rows)
    if len(outs) != n_outputs:
        raise DataError(f"the model gives {len(outs)} output(s) for {n_outputs} label column(s)")
    return [tuple(int(d) for d in o.shape[1:]) for o in outs]


__all__ = ["HorovodEstimatorMethods", "HorovodModelMethods", "model_kwargs", "vector_labels", "infer_output_shapes",
           "CHECKPOINT_READERS"]
