"""The Spark MLlib face, built from a framework descriptor: an ``Estimator`` and its fitted ``Model``.

:func:`build` makes the two classes of one framework (``hora.spark.torch.TorchEstimator``
and ``TorchModel``). Every parameter of the framework's config class is a Spark
``Param`` declared by its own generated ``Has*`` mixin (``HasBatchSize`` declares
``batch_size`` with ``getBatchSize`` / ``setBatchSize``), shared by every framework, so
``ParamGridBuilder().addGrid(est.batch_size, [32, 64])`` and ``est.copy({est.epochs: 3})``
work as for any MLlib stage. ``_fit`` turns the Params into the framework's config and
calls the shared :func:`hora.estimators.driver.fit.fit`; there is no framework code here.

Persistence (``MLWritable`` / ``MLReadable``): Spark's ``metadata/`` (class, uid and
the JSON Params, read by ``DefaultParamsReader`` and ``PipelineModel.load``) plus side
files in ``<path>/hora/``: the pickled Params (model, optimizer, loss, callables...)
and, for a fitted model, the model's files as the framework's codec writes them.
``backend`` is not saved (as in Horovod: it is recreated for each run).
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any, ClassVar, Sequence

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from hora import _spark
from hora.errors import ConfigError, DataError, StoreError
from hora.estimators.driver import fit as core
from hora.estimators.driver import persistence
from hora.estimators.faces import horovod as horovod_face
from hora.estimators.faces.history import plot_history
from hora.estimators.data.columns import inference_columns
from hora.estimators.data.frames import check_face
from hora.estimators.framework import Framework
from hora.estimators.params import (
    PARAM_DOCS, EstimatorConfig, check_param_names, default_output_cols, json_params, mllib_aliases, param_defaults,
    param_docs, param_signature, unsaved_params,
)
from hora.estimators.driver.spark_python import explain_worker_failure
from hora.estimators.tasks import ClassifierCodec, ClassifierHead
from hora.estimators.driver.transform import DEFAULT_PREDICT_BATCH, spark_transform

logger = logging.getLogger(__name__)

SIDE_DIR = "hora"


# ---------------------------------------------------------------------------------------
# generated Has* mixins: one per Param name, with get<Name>/set<Name>
# ---------------------------------------------------------------------------------------
def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


_MIXINS: dict[str, type] = {}


def param_mixin(name: str, doc: str) -> type:
    """The ``Params`` mixin declaring the Param ``name`` with ``get<Name>`` / ``set<Name>`` (one per name)."""
    if name in _MIXINS:
        return _MIXINS[name]
    camel = _camel(name)

    def getter(self: Params) -> Any:
        return self.getOrDefault(getattr(self, name))

    def setter(self: Params, value: Any) -> Params:
        return self._set(**{name: value})

    getter.__name__, getter.__doc__ = f"get{camel}", f"Gets the value of {name}: {doc}."
    setter.__name__, setter.__doc__ = f"set{camel}", f"Sets the value of {name}: {doc}."
    mixin = type(f"Has{camel}", (Params,), {
        name: Param(Params._dummy(), name, doc, typeConverter=TypeConverters.identity),
        f"get{camel}": getter, f"set{camel}": setter,
        "__doc__": f"Mixin for the param {name}: {doc}.", "__module__": __name__,
    })
    _MIXINS[name] = mixin
    globals()[mixin.__name__] = mixin  # importable, so pickled stages find their mixins
    return mixin


#: every shared Param (HasBatchSize, ...) in one class: Horovod's ``EstimatorParams``, a base of every estimator
EstimatorParams = type("EstimatorParams", tuple(param_mixin(n, d) for n, d in param_docs(EstimatorConfig).items()), {
    "__module__": __name__, "__doc__": "The Spark Params every hora Spark estimator shares (Horovod's EstimatorParams)."})

#: the fitted model's Params (all JSON metadata; shared names reuse the estimator's mixin)
MODEL_PARAMS: dict[str, str] = {
    "feature_cols": "one entry per model input: a column, or a list of scalar columns stacked into one input",
    "label_cols": "label column names; one model output per label",
    "output_cols": "prediction column names (default 'prediction' for one label, '<label>__output' for several)",
    "input_shapes": "shape each feature input is reshaped to, including the batch dimension",
    "run_id": "the id of the training run in the store",
    "history": "per-epoch training metrics (a list of dicts)",
    "output_shapes": "per-row shape of each model output",
    "batch_size": "rows per forward pass during transform",
    "task": "'classification' or 'regression': what the model was fitted as",
    "classifier": "a classifier's classes and scores ({'classes', 'scores', 'single'}; None for a regressor)",
    "prediction_col": "a classifier's class index column (double), MLlib's predictionCol",
    "probability_col": "a classifier's class probabilities column (an ML vector), MLlib's probabilityCol",
    "raw_prediction_col": "a classifier's logits column (an ML vector), MLlib's rawPredictionCol",
    "inference_columns": "the fit's decode_fn, max_length, truncation and collate_fn, which transform applies "
                         "(None: the defaults)",
    "vector_outputs": "multi-valued outputs as ML vectors instead of arrays (as Horovod: a model fitted on ML "
                      "vector labels, or built with Horovod's keywords)",
}
#: model Params saved pickled beside the JSON metadata (they hold functions)
MODEL_PICKLED_PARAMS = frozenset({"inference_columns"})
_MODEL_MIXINS = [param_mixin(n, d) for n, d in MODEL_PARAMS.items()]
#: the fitted model's constructor keywords: ``{name: (type as declared, default)}``
MODEL_PARAM_TYPES: dict[str, tuple[str, Any]] = {
    "model": ("Any", None),
    "feature_cols": ("Sequence[str | Sequence[str]] | None", None),
    "label_cols": ("Sequence[str] | None", None),
    "output_cols": ("Sequence[str] | None", None),
    "input_shapes": ("Sequence[Sequence[int]] | None", None),
    "run_id": ("str | None", None),
    "history": ("Sequence[dict[str, float]] | None", None),
    "output_shapes": ("Sequence[Sequence[int]] | None", None),
    "batch_size": ("int", DEFAULT_PREDICT_BATCH),
    "task": ("str", "regression"),
    "classifier": ("dict[str, Any] | None", None),
    "prediction_col": ("str", "prediction"),
    "probability_col": ("str", "probability"),
    "raw_prediction_col": ("str", "rawPrediction"),
    "inference_columns": ("dict[str, Any] | None", None),
    "vector_outputs": ("bool", False),
    # Horovod's keywords (hora.estimators.faces.horovod.model_kwargs)
    "feature_columns": ("Sequence[str] | None", None),
    "label_columns": ("Sequence[str] | None", None),
    "optimizer": ("Any", None),
    "loss": ("Any", None),
    "loss_constructors": ("Any", None),
    "custom_objects": ("Any", None),
    "_metadata": ("dict[str, Any] | None", None),
}


def model_signature() -> inspect.Signature:
    """The Spark model constructor's signature (keyword-only ``model`` and :data:`MODEL_PARAM_TYPES`)."""
    kw = inspect.Parameter.KEYWORD_ONLY
    return inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
                             + [inspect.Parameter(n, kw, default=d, annotation=t)
                                for n, (t, d) in MODEL_PARAM_TYPES.items()], return_annotation=None)


class _HoraWriter(MLWriter):
    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance

    def save(self, path: str) -> None:
        """Save to ``path`` (clearing it first with ``overwrite()``), on a classic or a Spark Connect session."""
        if self.shouldOverwrite:
            _spark.overwrite_path(self.sparkSession, path)
        self.saveImpl(path)

    def saveImpl(self, path: str) -> None:  # noqa: N802 (pyspark's name)
        self.instance._save_to(path, self.sparkSession)


class _HoraReader(MLReader):
    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> Any:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        return self.cls._load_from(path, metadata, self.sparkSession)


class _Persisted(MLWritable, MLReadable):
    """``write()`` / ``read()`` through the class's ``_save_to`` / ``_load_from`` (JSON metadata and side files)."""

    def write(self) -> MLWriter:
        """An MLWriter saving the JSON params as Spark metadata and the others as side files."""
        return _HoraWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _HoraReader(cls)


def _check_client_sees(path: str, spark: Any, saving: bool) -> None:
    """On Spark Connect, fail clearly when the server's ``path`` is not the client's.

    Spark's ``metadata/`` is written and read by the Connect server, hora's side files by
    this client: the two must see the same ``path`` (a shared or object store).

    Raises:
        StoreError: the client does not see the ``metadata/`` folder the server wrote (or read) at ``path``.
    """
    if not _spark.is_connect(spark) or persistence.open_store(path).exists("metadata"):
        return
    did = "wrote" if saving else "read"
    raise StoreError(
        f"the Spark Connect server {did} {path}/metadata on its machine, but this client does not see it at {path}: "
        f"Spark's metadata goes through the server and hora's model files through the client, so use a location both "
        f"reach (s3://..., hdfs://..., gs://..., a shared file system)"
    )


def _split_params(instance: Params, names: Sequence[str], json_names: frozenset[str],
                  unsaved: frozenset[str] = frozenset()) -> tuple[dict[str, Any], dict[str, Any]]:
    """(explicitly set JSON params, other explicitly set params to pickle); ``unsaved`` ones are left out."""
    json_out, objects = {}, {}
    for name in names:
        param = instance.getParam(name)
        if instance.isSet(param) and name not in unsaved:
            (json_out if name in json_names else objects)[name] = instance.getOrDefault(param)
    return json_out, objects


# ---------------------------------------------------------------------------------------
# the estimator
# ---------------------------------------------------------------------------------------
class SparkEstimator(Estimator, _Persisted, horovod_face.HorovodEstimatorMethods):
    """An MLlib Estimator over the shared core; :func:`build` makes one per framework.

    Raises (from ``fit``):
        ConfigError, DataError: bad params or data, before any worker starts; a Spark
            whose Python workers lack hora's dependencies (names ``PYSPARK_PYTHON``).
        WorkerFailedError: a training worker failed.
    """

    framework: ClassVar[Framework]
    model_class: ClassVar[type]

    @keyword_only
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._setDefault(**param_defaults(self.framework.config))
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs: Any) -> "SparkEstimator":  # noqa: N802 (MLlib's name)
        """Set any of the estimator's params by keyword; returns self.

        Raises:
            ParamError: an unknown parameter (a ConfigError and a TypeError; Horovod's names
                say what to use instead).
        """
        kwargs = mllib_aliases(self._input_kwargs)
        check_param_names(self.framework.config, kwargs, type(self).__name__)
        return self._set(**kwargs)

    def _param_names(self) -> list[str]:
        return list(param_defaults(self.framework.config))

    def _config(self) -> Any:
        return self.framework.make_config({name: self.getOrDefault(name) for name in self._param_names()})

    def _fit(self, dataset: Any) -> Any:
        check_face(dataset, "hora.spark", f"{type(self).__name__}.fit")
        config = self._config()
        try:
            result = core.fit(dataset, config, self.framework, spark=dataset.sparkSession,
                              load_checkpoint=self._checkpoint_reader())
        except DataError:
            raise
        except ConfigError as exc:
            if "executors cannot import" in str(exc):  # the launcher's or store's view: name the interpreter too
                explain_worker_failure(dataset.sparkSession, exc, self.framework)
            raise
        except Exception as exc:
            explain_worker_failure(dataset.sparkSession, exc, self.framework)
            raise
        model = self.model_class._from_result(result, config)
        if horovod_face.vector_labels(dataset, config.label_cols):  # as Horovod: a vector label's prediction is one
            model._set(vector_outputs=True)
        return model

    # persistence ------------------------------------------------------------------------
    def _save_to(self, path: str, spark: Any) -> None:
        cfg = self.framework.config
        json_out, objects = _split_params(self, self._param_names(), json_params(cfg), unsaved_params(cfg))
        DefaultParamsWriter.saveMetadata(self, path, spark, extraMetadata={"hora": "estimator"}, paramMap=json_out)
        _check_client_sees(path, spark, saving=True)
        persistence.save_objects(os.path.join(path, SIDE_DIR), {"class": persistence.class_path(self)}, objects)

    @classmethod
    def _load_from(cls, path: str, metadata: dict[str, Any], spark: Any) -> "SparkEstimator":
        _check_client_sees(path, spark, saving=False)
        est = cls()
        est._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(est, metadata)
        _, objects = persistence.load_objects(os.path.join(path, SIDE_DIR))
        est._set(**objects)
        return est


# ---------------------------------------------------------------------------------------
# the fitted model
# ---------------------------------------------------------------------------------------
class SparkModel(Model, _Persisted, horovod_face.HorovodModelMethods, *_MODEL_MIXINS):  # type: ignore[misc]
    """A fitted model as an MLlib ``Model``: ``transform`` runs batched inference on the executors.

    The trained framework model is :meth:`getModel`; ``getHistory()`` / ``history_`` hold
    the per-epoch metrics; :meth:`plot_history` draws them; ``setOutputCols`` names the
    prediction columns (as in Horovod). A classifier (``getTask() == "classification"``)
    outputs MLlib's three columns instead, named by ``setRawPredictionCol`` (a vector of
    the model's scores), ``setProbabilityCol`` (a vector of class probabilities) and
    ``setPredictionCol`` (the class index, a double), as MLlib's evaluators expect.
    """

    framework: ClassVar[Framework]

    @keyword_only
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._setDefault(output_cols=None, input_shapes=None, run_id=None, history=[], output_shapes=None,
                         batch_size=DEFAULT_PREDICT_BATCH, task="regression", classifier=None,
                         prediction_col="prediction", probability_col="probability",
                         raw_prediction_col="rawPrediction", inference_columns=None, vector_outputs=False)
        kwargs, self._horovod = horovod_face.model_kwargs(kwargs)  # Horovod's keywords
        self._model = kwargs.pop("model", None)
        #: seconds spent in each phase of the fit that produced this model (not persisted)
        self.fit_timings_: dict[str, float] = {}
        self._files: dict[str, bytes] | None = None
        self._set(**kwargs)

    @classmethod
    def _from_result(cls, result: core.FitResult, config: Any) -> "SparkModel":
        model = cls(model=result.model, feature_cols=list(config.feature_cols), label_cols=list(config.label_cols),
                    output_cols=default_output_cols(config.label_cols, config.output_cols),
                    input_shapes=result.input_shapes, run_id=result.run_id, history=result.history,
                    output_shapes=[list(s) for s in result.output_shapes],
                    task="classification" if result.classifier else "regression",
                    classifier=result.classifier.to_meta() if result.classifier else None,
                    prediction_col=config.prediction_col, probability_col=config.probability_col,
                    raw_prediction_col=config.raw_prediction_col, inference_columns=inference_columns(config, result.dataset))
        model.fit_timings_ = dict(result.extra.get("timings", {}))
        return model

    def getModel(self) -> Any:  # noqa: N802 (MLlib style)
        """The trained framework model."""
        return self._model

    def save_pretrained(self, path: str, **kwargs: Any) -> None:
        """A Hugging Face model in the Hugging Face format (see :meth:`hora.estimators.frameworks.torch.hf.HFModule.save_pretrained`)."""
        save = getattr(self._model, "save_pretrained", None)
        if save is None:
            raise ConfigError(f"save_pretrained writes a Hugging Face model, but this fitted model is a "
                              f"{type(self._model).__name__}; persist it with save()/write()")
        save(path, **kwargs)

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

    def _model_files(self) -> dict[str, bytes]:
        if self._files is None:
            self._files = self.framework.codec.serialize(self._model)
        return self._files

    def _transform(self, dataset: Any) -> Any:
        check_face(dataset, "hora.spark", f"{type(self).__name__}.transform")
        if self._model is None:
            raise ConfigError(f"{type(self).__name__} holds no trained model")
        if not self.getOrDefault("output_shapes") and self.getOrDefault("feature_cols") and self.getOrDefault("label_cols"):
            # a model built by hand: its outputs' shapes from a forward pass on the first rows
            self._set(output_shapes=[list(s) for s in horovod_face.infer_output_shapes(
                self.framework.codec, self._model, dataset, self.getOrDefault("feature_cols"),
                self.getOrDefault("input_shapes"), len(self.getOrDefault("label_cols")))])
        if not self.getOrDefault("output_shapes") or not self.getOrDefault("feature_cols"):
            raise ConfigError(
                f"{type(self).__name__} needs feature_cols and output_shapes (per-row shape of each output) to transform"
            )
        head = ClassifierHead.from_meta(self.getOrDefault("classifier"))
        if head is None:
            names = default_output_cols(self.getOrDefault("label_cols"), self.getOrDefault("output_cols"))
            shapes = [tuple(s) for s in self.getOrDefault("output_shapes")]
            out = spark_transform(
                dataset, self.framework.codec, self._model_files(), self.getOrDefault("feature_cols"),
                self.getOrDefault("input_shapes"), names, shapes, int(self.getOrDefault("batch_size")),
                columns=self.getOrDefault("inference_columns"),
            )
            if self.getOrDefault("vector_outputs"):  # Horovod's: multi-valued outputs as ML vectors
                to_vector, F = _array_to_vector(out), _spark.functions(out)
                for name, shape in zip(names, shapes):
                    if tuple(shape) not in ((), (1,)):
                        out = out.withColumn(name, to_vector(F.col(f"`{name}`")))
            return out
        codec = ClassifierCodec(self.framework.codec, head)
        raw, prob = self.getOrDefault("raw_prediction_col"), self.getOrDefault("probability_col")
        names = [raw, prob, self.getOrDefault("prediction_col")]
        if len(set(names)) != 3:
            raise ConfigError(f"{type(self).__name__}: rawPrediction, probability and prediction columns must "
                              f"differ, got {names}")
        out = spark_transform(dataset, codec, self._model_files(), self.getOrDefault("feature_cols"),
                              self.getOrDefault("input_shapes"), names, codec.output_shapes(),
                              int(self.getOrDefault("batch_size")), columns=self.getOrDefault("inference_columns"))
        to_vector = _array_to_vector(out)
        F = _spark.functions(out)
        return out.withColumn(raw, to_vector(F.col(f"`{raw}`"))).withColumn(prob, to_vector(F.col(f"`{prob}`")))

    def copy(self, extra: dict | None = None) -> "SparkModel":
        """A copy with the same uid and params (plus ``extra``) and its own copy of the trained model."""
        model, self._model = self._model, None
        try:
            that = super().copy(extra)
        finally:
            self._model = model
        that._model = self.framework.codec.clone(model) if model is not None else None
        that._files = None
        return that

    # persistence ------------------------------------------------------------------------
    def _save_to(self, path: str, spark: Any) -> None:
        json_out, objects = _split_params(self, list(MODEL_PARAMS), frozenset(MODEL_PARAMS) - MODEL_PICKLED_PARAMS)
        DefaultParamsWriter.saveMetadata(self, path, spark, extraMetadata={"hora": "model"}, paramMap=json_out)
        _check_client_sees(path, spark, saving=True)
        persistence.save_fitted(os.path.join(path, SIDE_DIR), self.framework.codec, self._model,
                                {"face": "spark", "class": persistence.class_path(self)}, objects=objects)

    @classmethod
    def _load_from(cls, path: str, metadata: dict[str, Any], spark: Any) -> "SparkModel":
        _check_client_sees(path, spark, saving=False)
        _, model, _, objects = persistence.load_fitted(os.path.join(path, SIDE_DIR))
        inst = cls(model=model)
        inst._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(inst, metadata)
        inst._set(**objects)
        return inst


def _array_to_vector(df: Any) -> Any:
    """``array_to_vector`` for the kind of session ``df`` belongs to."""
    if _spark.is_connect(df):
        from pyspark.ml.connect.functions import array_to_vector
    else:
        from pyspark.ml.functions import array_to_vector
    return array_to_vector


def build(framework: Framework, module: str, estimator_name: str, model_name: str) -> tuple[type, type]:
    """The Spark ``(Estimator, Model)`` classes of ``framework``, named as they are imported from ``module``."""
    docs = param_docs(framework.config)

    # per-class constructors whose signatures list every keyword, typed (pyspark's keyword_only
    # on the base methods still collects them into _input_kwargs)
    def model_init(self: SparkModel, **kwargs: Any) -> None:
        SparkModel.__init__(self, **kwargs)

    def est_init(self: SparkEstimator, **kwargs: Any) -> None:
        SparkEstimator.__init__(self, **kwargs)

    def set_params(self: SparkEstimator, **kwargs: Any) -> SparkEstimator:
        return SparkEstimator.setParams(self, **kwargs)

    model_init.__signature__ = model_signature()  # type: ignore[attr-defined]
    est_init.__signature__ = param_signature(framework.config)  # type: ignore[attr-defined]
    set_params.__signature__ = param_signature(  # type: ignore[attr-defined]
        framework.config, return_annotation=estimator_name)
    set_params.__doc__ = SparkEstimator.setParams.__doc__
    for fn, name, owner in ((model_init, "__init__", model_name), (est_init, "__init__", estimator_name),
                            (set_params, "setParams", estimator_name)):
        fn.__name__, fn.__qualname__, fn.__module__ = name, f"{owner}.{name}", module
    model_cls = type(model_name, (SparkModel,), {
        "framework": framework, "__module__": module, "__qualname__": model_name, "__init__": model_init,
        "__doc__": f"A fitted {framework.name} model on Spark: getModel() is {framework.model_kind}. "
                   f"See hora.estimators.faces.spark.SparkModel.",
    })
    own = [param_mixin(n, d) for n, d in docs.items() if n not in PARAM_DOCS]  # the framework's own Params
    est_cls = type(estimator_name, (SparkEstimator, EstimatorParams, *own), {
        "framework": framework, "model_class": model_cls, "__module__": module, "__qualname__": estimator_name,
        "__init__": est_init, "setParams": set_params,
        "__doc__": f"Train {framework.model_kind} data-parallel on a Spark DataFrame; fit returns a {model_name}.\n\n"
                   "Params (keyword arguments, each also a Spark Param with get/set accessors):\n\n"
                   + "\n".join(f"* ``{n}``: {d}" for n, d in docs.items()),
    })
    return est_cls, model_cls


__all__ = ["SparkEstimator", "SparkModel", "EstimatorParams", "build", "param_mixin", "MODEL_PARAMS", "MODEL_PARAM_TYPES",
           "model_signature"]
