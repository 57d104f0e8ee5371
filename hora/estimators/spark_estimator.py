"""The Spark MLlib face: ``hora.spark.TorchEstimator`` (an ``Estimator``) and ``hora.spark.TorchModel`` (a ``Model``).

Every shared parameter is a Spark ``Param`` declared by its own generated ``Has*``
mixin (``HasBatchSize`` declares ``batch_size`` with ``getBatchSize`` /
``setBatchSize``), so ``ParamGridBuilder().addGrid(est.batch_size, [32, 64])`` and
``est.copy({est.epochs: 3})`` work as for any MLlib stage. ``_fit`` turns the Params
into an :class:`~hora.estimators.params.EstimatorConfig` and calls the shared
:func:`hora.estimators.core.fit`; there is no training logic here.

Persistence (``MLWritable`` / ``MLReadable``): Spark's ``metadata/`` (class, uid and
the JSON-able Params, read by ``DefaultParamsReader`` and ``PipelineModel.load``)
plus side files in ``<path>/hora/``: the pickled non-JSON params (model, optimizer,
loss, callables...) and, for a fitted model, the model definition and weights.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Any, Sequence

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from hora.errors import ConfigError
from hora.estimators import core, persistence
from hora.estimators.base import plot_history
from hora.estimators.params import JSON_PARAMS, PARAM_DEFAULTS, PARAM_DOCS, EstimatorConfig, default_output_cols
from hora.estimators.trainer import Trainer
from hora.estimators.transform import DEFAULT_PREDICT_BATCH, spark_transform

logger = logging.getLogger(__name__)

SIDE_DIR = "hora"


# ---------------------------------------------------------------------------------------
# generated Has* mixins: one per shared Param, with get<Name>/set<Name>
# ---------------------------------------------------------------------------------------
def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def make_param_mixin(name: str, doc: str) -> type:
    """A ``Params`` mixin declaring the Param ``name`` and its ``get<Name>`` / ``set<Name>`` accessors."""
    camel = _camel(name)

    def getter(self: Params) -> Any:
        return self.getOrDefault(getattr(self, name))

    def setter(self: Params, value: Any) -> Params:
        return self._set(**{name: value})

    getter.__name__, getter.__doc__ = f"get{camel}", f"Gets the value of {name}: {doc}."
    setter.__name__, setter.__doc__ = f"set{camel}", f"Sets the value of {name}: {doc}."
    return type(
        f"Has{camel}",
        (Params,),
        {
            name: Param(Params._dummy(), name, doc, typeConverter=TypeConverters.identity),
            f"get{camel}": getter,
            f"set{camel}": setter,
            "__doc__": f"Mixin for the param {name}: {doc}.",
            "__module__": __name__,
        },
    )


_MIXINS: dict[str, type] = {name: make_param_mixin(name, PARAM_DOCS[name]) for name in PARAM_DEFAULTS}
globals().update({m.__name__: m for m in _MIXINS.values()})

_MODEL_PARAMS: dict[str, str] = {
    "feature_cols": PARAM_DOCS["feature_cols"],
    "label_cols": PARAM_DOCS["label_cols"],
    "output_cols": PARAM_DOCS["output_cols"],
    "input_shapes": PARAM_DOCS["input_shapes"],
    "run_id": "the id of the training run in the store",
    "history": "per-epoch training metrics (a list of dicts)",
    "output_shapes": "per-row shape of each model output",
    "batch_size": "rows per forward pass during transform",
}
_MODEL_MIXINS = [_MIXINS[n] if n in _MIXINS else make_param_mixin(n, d) for n, d in _MODEL_PARAMS.items()]
for _m in _MODEL_MIXINS:
    globals().setdefault(_m.__name__, _m)


# ---------------------------------------------------------------------------------------
# persistence plumbing
# ---------------------------------------------------------------------------------------
class _HoraWriter(MLWriter):
    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:  # noqa: N802 (pyspark's name)
        self.instance._save_to(path, self.sparkSession)


class _HoraReader(MLReader):
    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> Any:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        return self.cls._load_from(path, metadata, self.sparkSession)


def _split_params(instance: Params, names: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(JSON-able explicitly set params, other explicitly set params)."""
    json_params, objects = {}, {}
    for name in names:
        param = instance.getParam(name)
        if instance.isSet(param):
            value = instance.getOrDefault(param)
            (json_params if name in JSON_PARAMS or name in ("history", "output_shapes") else objects)[name] = value
    return json_params, objects


# ---------------------------------------------------------------------------------------
# the estimator
# ---------------------------------------------------------------------------------------
class SparkEstimatorBase(Estimator, MLWritable, MLReadable, *_MIXINS.values()):  # type: ignore[misc]
    """An MLlib Estimator over the shared core; subclasses set ``trainer_class`` and ``model_class``.

    Raises (from ``fit``):
        ConfigError, DataError: bad params or data, before any worker starts.
        WorkerFailedError: a training worker failed.
    """

    trainer_class: type[Trainer] = Trainer
    model_class: type = Model

    @keyword_only
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._setDefault(**PARAM_DEFAULTS)
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs: Any) -> "SparkEstimatorBase":  # noqa: N802 (MLlib's name)
        """Set any of the estimator's params by keyword; returns self.

        Raises:
            ConfigError: an unknown parameter name.
        """
        unknown = set(self._input_kwargs) - set(PARAM_DEFAULTS)
        if unknown:
            raise ConfigError(f"{type(self).__name__} has no parameters {sorted(unknown)}; it has {list(PARAM_DEFAULTS)}")
        return self._set(**self._input_kwargs)

    def _config(self) -> EstimatorConfig:
        return EstimatorConfig.from_params({name: self.getOrDefault(name) for name in PARAM_DEFAULTS})

    def _fit(self, dataset: Any) -> Any:
        config = self._config()
        trainer = self.trainer_class()
        result = core.fit(dataset, config, trainer, backend="spark", spark=dataset.sparkSession)
        return self.model_class._from_result(result, config, trainer)

    # persistence ------------------------------------------------------------------------
    def write(self) -> MLWriter:
        """An MLWriter saving the JSON params as metadata and the others as pickled side files."""
        return _HoraWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _HoraReader(cls)

    def _save_to(self, path: str, spark: Any) -> None:
        json_params, objects = _split_params(self, list(PARAM_DEFAULTS))
        DefaultParamsWriter.saveMetadata(self, path, spark, extraMetadata={"hora": "estimator"}, paramMap=json_params)
        persistence.save_objects(os.path.join(path, SIDE_DIR), {"class": persistence.class_path(self)}, objects)

    @classmethod
    def _load_from(cls, path: str, metadata: dict[str, Any], spark: Any) -> "SparkEstimatorBase":
        est = cls()
        est._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(est, metadata)
        _, objects = persistence.load_objects(os.path.join(path, SIDE_DIR))
        est._set(**objects)
        return est


# ---------------------------------------------------------------------------------------
# the fitted model
# ---------------------------------------------------------------------------------------
class SparkModelBase(Model, MLWritable, MLReadable, *_MODEL_MIXINS):  # type: ignore[misc]
    """A fitted model as an MLlib ``Model``: ``transform`` runs batched inference on the executors.

    The trained framework model is :meth:`getModel`; ``getHistory()`` / ``history_`` hold
    the per-epoch metrics; :meth:`plot_history` draws them.
    """

    trainer_class: type[Trainer] = Trainer

    @keyword_only
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._setDefault(output_cols=None, input_shapes=None, run_id=None, history=[], output_shapes=None,
                         batch_size=DEFAULT_PREDICT_BATCH)
        model = kwargs.pop("model", None)
        self._model = model
        #: seconds spent in each phase of the fit that produced this model (not persisted)
        self.fit_timings_: dict[str, float] = {}
        self._files: dict[str, bytes] | None = None
        self._set(**kwargs)

    @classmethod
    def _from_result(cls, result: core.FitResult, config: EstimatorConfig, trainer: Trainer) -> "SparkModelBase":
        model = cls._build(result, config)
        model.fit_timings_ = dict(result.extra.get("timings", {}))
        return model

    @classmethod
    def _build(cls, result: core.FitResult, config: EstimatorConfig) -> "SparkModelBase":
        return cls(
            model=result.model,
            feature_cols=list(config.feature_cols),
            label_cols=list(config.label_cols),
            output_cols=default_output_cols(config.label_cols, config.output_cols),
            input_shapes=config.input_shapes,
            run_id=result.run_id,
            history=result.history,
            output_shapes=[list(s) for s in result.output_shapes],
        )

    def getModel(self) -> Any:  # noqa: N802 (MLlib style)
        """The trained framework model (a ``torch.nn.Module`` for TorchModel)."""
        return self._model

    def getHistory(self) -> list[dict[str, float]]:  # noqa: N802 (MLlib style)
        """Per-epoch metrics (``epoch``, ``loss``, ``val_loss``, ``val_<metric>``...)."""
        return self.history_

    @property
    def history_(self) -> list[dict[str, float]]:
        """Per-epoch metrics (same as :meth:`getHistory`)."""
        return list(self.getOrDefault("history") or [])

    def plot_history(self, metrics: Sequence[str] | None = None) -> Any:
        """A matplotlib Figure of the training / validation curves."""
        return plot_history(self.history_, metrics, title=self.getOrDefault("run_id"))

    def _output_cols(self) -> list[str]:
        return default_output_cols(self.getOrDefault("label_cols"), self.getOrDefault("output_cols"))

    def _model_files(self) -> dict[str, bytes]:
        if self._files is None:
            self._files = self.trainer_class().serialize_model(self._model)
        return self._files

    def _transform(self, dataset: Any) -> Any:
        if self._model is None:
            raise ConfigError(f"{type(self).__name__} holds no trained model")
        if not self.getOrDefault("output_shapes") or not self.getOrDefault("feature_cols"):
            raise ConfigError(
                f"{type(self).__name__} needs feature_cols and output_shapes (per-row shape of each output) to transform"
            )
        return spark_transform(
            dataset,
            self.trainer_class(),
            self._model_files(),
            self.getOrDefault("feature_cols"),
            self.getOrDefault("input_shapes"),
            self._output_cols(),
            [tuple(s) for s in self.getOrDefault("output_shapes")],
            int(self.getOrDefault("batch_size")),
        )

    def copy(self, extra: dict | None = None) -> "SparkModelBase":
        """A copy with the same uid and params (plus ``extra``) and its own deep copy of the trained model."""
        that = super().copy(extra)
        that._model = copy.deepcopy(self._model)
        that._files = None
        return that

    # persistence ------------------------------------------------------------------------
    def write(self) -> MLWriter:
        """An MLWriter saving params as metadata and the model definition and weights as side files."""
        return _HoraWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _HoraReader(cls)

    def _save_to(self, path: str, spark: Any) -> None:
        json_params, objects = _split_params(self, list(_MODEL_PARAMS))
        DefaultParamsWriter.saveMetadata(self, path, spark, extraMetadata={"hora": "model"}, paramMap=json_params)
        persistence.save_fitted(os.path.join(path, SIDE_DIR), self.trainer_class(), self._model,
                                {"face": "spark", "class": persistence.class_path(self)}, objects=objects)

    @classmethod
    def _load_from(cls, path: str, metadata: dict[str, Any], spark: Any) -> "SparkModelBase":
        _, model, _, objects = persistence.load_fitted(os.path.join(path, SIDE_DIR))
        inst = cls(model=model)
        inst._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(inst, metadata)
        inst._set(**objects)
        return inst


class TorchModel(SparkModelBase):
    """A fitted PyTorch model on Spark (see :class:`SparkModelBase`)."""

    from hora.estimators.torch_trainer import TorchTrainer as trainer_class  # noqa: N813


class TorchEstimator(SparkEstimatorBase):
    """Train a PyTorch model data-parallel on a Spark DataFrame; ``fit`` returns a :class:`TorchModel`.

    Params (keyword arguments, each also a Spark Param with get/set accessors): see
    :data:`hora.estimators.params.PARAM_DOCS`. ``learning_rate`` overrides the
    optimizer's learning rate (for ``ParamGridBuilder``); ``lr_scaling="linear"`` (the
    default) multiplies it by ``num_proc`` on the workers, as Horovod does.
    """

    from hora.estimators.torch_trainer import TorchTrainer as trainer_class  # noqa: N813

    model_class = TorchModel


__all__ = ["TorchEstimator", "TorchModel", "SparkEstimatorBase", "SparkModelBase", "make_param_mixin"]
