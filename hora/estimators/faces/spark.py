"""The Spark MLlib face: the bases of every Spark ``Estimator`` and its fitted ``Model``.

Each framework's classes are written in its public module (``hora.spark.torch.estimator``:
``class TorchEstimator(SparkEstimator[TorchModel])`` with ``framework = TORCH`` and its
keyword-only ``__init__`` / ``setParams``). Every parameter of the framework's config class
is a Spark ``Param`` with ``get<Name>`` / ``set<Name>`` accessors (``batch_size``:
``getBatchSize`` / ``setBatchSize``), declared from the config's fields by
:func:`declare_params`: the shared ones on :class:`EstimatorParams`, a framework's own
ones on its estimator class. So ``ParamGridBuilder().addGrid(est.batch_size, [32, 64])``
and ``est.copy({est.epochs: 3})`` work as for any MLlib stage. ``_fit`` turns the Params
into the framework's config and calls the shared :func:`hora.estimators.driver.fit.fit`;
there is no framework code here.

Persistence (``MLWritable`` / ``MLReadable``): Spark's ``metadata/`` (class, uid and
the JSON Params, read by ``DefaultParamsReader`` and ``PipelineModel.load``) plus side
files in ``<path>/hora/``: the pickled Params (model, optimizer, loss, callables...)
and, for a fitted model, the model's files as the framework's codec writes them.
``backend`` is not saved (as in Horovod: it is recreated for each run).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, ClassVar, Sequence, TypeVar

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
    EstimatorConfig, check_param_names, default_output_cols, json_params, mllib_aliases, param_defaults, param_docs,
    unsaved_params,
)
from hora.estimators.driver.spark_python import explain_worker_failure
from hora.estimators.param_info import keyword_params, params_section
from hora.estimators.tasks import CausalLMHead, ClassifierCodec, ClassifierHead, head_codec
from hora.estimators.driver.spark_transform import spark_transform
from hora.estimators.driver.transform import DEFAULT_PREDICT_BATCH

logger = logging.getLogger(__name__)

SIDE_DIR = "hora"


# ---------------------------------------------------------------------------------------
# Params declared from the config's fields, each with get<Name>/set<Name>
# ---------------------------------------------------------------------------------------
def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _accessors(cls: type, name: str, doc: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    camel = _camel(name)

    def getter(self: Params) -> Any:
        return self.getOrDefault(getattr(self, name))

    def setter(self: Params, value: Any) -> Params:
        return self._set(**{name: value})

    for fn, verb in ((getter, "get"), (setter, "set")):
        fn.__name__ = f"{verb}{camel}"
        fn.__qualname__, fn.__module__ = f"{cls.__qualname__}.{fn.__name__}", cls.__module__
        fn.__doc__ = f"{verb.capitalize()}s the value of {name}: {doc}."
    return getter, setter


def declare_params(cls: type, docs: dict[str, str]) -> type:
    """Declare on the ``Params`` class ``cls`` one Spark ``Param`` per ``{name: doc}`` with its
    ``get<Name>`` / ``set<Name>`` accessors (what pyspark's ``Has*`` mixins hold); a Param or an
    accessor ``cls`` already has (a hand-written getter) is kept. Returns ``cls``.

    Raises:
        TypeError: ``cls`` has an attribute of a Param's name that is not a ``Param``.
    """
    for name, doc in docs.items():
        current = getattr(cls, name, None)
        if current is None:
            setattr(cls, name, Param(Params._dummy(), name, doc, typeConverter=TypeConverters.identity))
        elif not isinstance(current, Param):
            raise TypeError(f"{cls.__name__}.{name} is not a Param, so the parameter {name!r} cannot be declared")
        getter, setter = _accessors(cls, name, doc)
        for fn in (getter, setter):
            if not hasattr(cls, fn.__name__):
                setattr(cls, fn.__name__, fn)
    return cls


class EstimatorParams(Params):
    """The Spark Params every hora Spark estimator shares (Horovod's ``EstimatorParams``).

    One ``Param`` per parameter of :class:`~hora.estimators.params.EstimatorConfig`, with
    its ``get<Name>`` / ``set<Name>`` accessors (``EstimatorParams.batch_size``,
    ``getBatchSize()``), declared from the config's fields by :func:`declare_params`.
    """


declare_params(EstimatorParams, param_docs(EstimatorConfig))

#: the fitted model's Params, declared on :class:`SparkModel` (JSON metadata, but :data:`MODEL_PICKLED_PARAMS`)
MODEL_PARAMS: dict[str, str] = {
    "feature_cols": "one entry per model input: a column, or a list of scalar columns stacked into one input",
    "label_cols": "label column names; one model output per label",
    "output_cols": "prediction column names (default 'prediction' for one label, '<label>__output' for several)",
    "input_shapes": "shape each feature input is reshaped to, including the batch dimension",
    "run_id": "the id of the training run in the store",
    "history": "per-epoch training metrics (a list of dicts)",
    "output_shapes": "per-row shape of each model output",
    "batch_size": "rows per forward pass during transform",
    "task": "'classification', 'regression' or 'causal_lm': what the model was fitted as",
    "classifier": "a classifier's classes and scores ({'classes', 'scores', 'single'}; a causal LM's {'task', "
                  "'generate_kwargs'}; None for a regressor)",
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
#: the fitted model class an estimator's ``fit`` returns
ModelT = TypeVar("ModelT", bound="SparkModel")


class SparkEstimator(Estimator[ModelT], EstimatorParams, _Persisted, horovod_face.HorovodEstimatorMethods):
    """An MLlib Estimator over the shared core, the base of each framework's Spark estimator.

    A subclass names its :class:`~hora.estimators.framework.Framework` (``framework = TORCH``)
    and its fitted model class (``model_class``), and writes its keyword-only ``__init__`` and
    ``setParams`` out (Spark's convention; a test checks them against the framework's config
    class). The framework's own parameters become Params of the subclass, and ``help()`` of
    the subclass lists every parameter with its doc.

    Raises (from ``fit``):
        ConfigError, DataError: bad params or data, before any worker starts; a Spark
            whose Python workers lack hora's dependencies (names ``PYSPARK_PYTHON``).
        WorkerFailedError: a training worker failed.
    """

    framework: ClassVar[Framework]
    model_class: ClassVar[type]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "framework" in cls.__dict__:  # a framework's estimator: its own Params, every parameter's doc
            declare_params(cls, param_docs(cls.framework.config))
            cls.__doc__ = params_section(cls.__doc__, cls.framework.config,
                                         "Params (keyword arguments, each also a Spark Param with get/set accessors)")

    @keyword_params
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._setDefault(**param_defaults(self.framework.config))
        self._set(**kwargs)

    @keyword_params
    def setParams(self, **kwargs: Any) -> "SparkEstimator":  # noqa: N802 (MLlib's name)
        """Set any of the estimator's params by keyword; returns self.

        Raises:
            ParamError: an unknown parameter (a ConfigError and a TypeError; Horovod's names
                say what to use instead).
        """
        return self._set(**kwargs)

    def _check_keywords(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` under hora's names (MLlib's aliases mapped), each a parameter of the framework.

        Raises:
            ParamError: an unknown parameter.
        """
        kwargs = mllib_aliases(kwargs)
        check_param_names(self.framework.config, kwargs, type(self).__name__)
        return kwargs

    def _param_names(self) -> list[str]:
        return list(param_defaults(self.framework.config))

    def _config(self) -> Any:
        return self.framework.make_config({name: self.getOrDefault(name) for name in self._param_names()})

    def _fit(self, dataset: Any) -> Any:
        source = check_face(dataset, "hora.spark", f"{type(self).__name__}.fit")
        config = self._config()
        try:
            result = core.fit(source, config, self.framework, spark=dataset.sparkSession,
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
class SparkModel(Model, _Persisted, horovod_face.HorovodModelMethods):
    """A fitted model as an MLlib ``Model``: ``transform`` runs batched inference on the executors.

    The trained framework model is :meth:`getModel`; ``getHistory()`` / ``history_`` hold
    the per-epoch metrics; :meth:`plot_history` draws them; ``setOutputCols`` names the
    prediction columns (as in Horovod). A classifier (``getTask() == "classification"``)
    outputs MLlib's three columns instead, named by ``setRawPredictionCol`` (a vector of
    the model's scores), ``setProbabilityCol`` (a vector of class probabilities) and
    ``setPredictionCol`` (the class index, a double), as MLlib's evaluators expect.
    Each of :data:`MODEL_PARAMS` is a Spark Param with ``get<Name>`` / ``set<Name>``.
    """

    framework: ClassVar[Framework]

    @keyword_only
    def __init__(
        self,
        *,
        model: Any = None,
        feature_cols: Sequence[str | Sequence[str]] | None = None,
        label_cols: Sequence[str] | None = None,
        output_cols: Sequence[str] | None = None,
        input_shapes: Sequence[Sequence[int]] | None = None,
        run_id: str | None = None,
        history: Sequence[dict[str, float]] | None = None,
        output_shapes: Sequence[Sequence[int]] | None = None,
        batch_size: int = DEFAULT_PREDICT_BATCH,
        task: str = "regression",
        classifier: dict[str, Any] | None = None,
        prediction_col: str = "prediction",
        probability_col: str = "probability",
        raw_prediction_col: str = "rawPrediction",
        inference_columns: dict[str, Any] | None = None,
        vector_outputs: bool = False,
        feature_columns: Sequence[str] | None = None,
        label_columns: Sequence[str] | None = None,
        optimizer: Any = None,
        loss: Any = None,
        loss_constructors: Any = None,
        custom_objects: Any = None,
        _metadata: dict[str, Any] | None = None,
    ) -> None:
        """A model holding the trained framework ``model``; each other keyword sets the Param of
        its name (:data:`MODEL_PARAMS`). ``feature_columns`` ... ``_metadata`` are Horovod's
        keywords for a model built by hand (:func:`hora.estimators.faces.horovod.model_kwargs`).

        Raises:
            ConfigError: a column list given under both hora's and Horovod's names.
        """
        kwargs = self._input_kwargs
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
        head = result.classifier
        cols, shapes = default_output_cols(config.label_cols, config.output_cols), list(result.output_shapes)
        if isinstance(head, CausalLMHead):  # a causal LM's columns: its per-row loss (and generated text)
            cols, shapes = head.output_cols(config.output_cols), head.output_shapes()
        model = cls(model=result.model, feature_cols=list(config.feature_cols), label_cols=list(config.label_cols),
                    output_cols=cols, input_shapes=result.input_shapes, run_id=result.run_id, history=result.history,
                    output_shapes=[list(s) for s in shapes],
                    task=head.task if head else "regression",
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
        source = check_face(dataset, "hora.spark", f"{type(self).__name__}.transform")
        if self._model is None:
            raise ConfigError(f"{type(self).__name__} holds no trained model")
        if not self.getOrDefault("output_shapes") and self.getOrDefault("feature_cols") and self.getOrDefault("label_cols"):
            # a model built by hand: its outputs' shapes from a forward pass on the first rows
            self._set(output_shapes=[list(s) for s in horovod_face.infer_output_shapes(
                self.framework.codec, self._model, source, self.getOrDefault("feature_cols"),
                self.getOrDefault("input_shapes"), len(self.getOrDefault("label_cols")))])
        if not self.getOrDefault("output_shapes") or not self.getOrDefault("feature_cols"):
            raise ConfigError(
                f"{type(self).__name__} needs feature_cols and output_shapes (per-row shape of each output) to transform"
            )
        head = ClassifierHead.from_meta(self.getOrDefault("classifier"))
        if isinstance(head, CausalLMHead):  # each row's mean token loss (and generated text)
            codec = head_codec(self.framework.codec, head)
            return spark_transform(dataset, codec, self._model_files(), self.getOrDefault("feature_cols"),
                                   self.getOrDefault("input_shapes"), head.output_cols(self.getOrDefault("output_cols")),
                                   head.output_shapes(), int(self.getOrDefault("batch_size")),
                                   columns=self.getOrDefault("inference_columns"))
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


declare_params(SparkModel, MODEL_PARAMS)


def _array_to_vector(df: Any) -> Any:
    """``array_to_vector`` for the kind of session ``df`` belongs to."""
    if _spark.is_connect(df):
        from pyspark.ml.connect.functions import array_to_vector
    else:
        from pyspark.ml.functions import array_to_vector
    return array_to_vector


#: ``Has<Name>`` mixins built for older pickles (see :func:`__getattr__`)
_OLD_MIXINS: dict[str, type] = {}


def __getattr__(name: str) -> type:
    """``Has<Name>``: the ``Params`` mixin declaring one Param, as older versions of this module
    generated for each parameter (a pickle may name one); built on first use.

    Raises:
        AttributeError: ``name`` is no ``Has<Name>`` of a parameter.
    """
    if name.startswith("Has") and name not in _OLD_MIXINS:
        from hora.estimators.framework import BUILTIN, get_framework

        docs = {**MODEL_PARAMS, **{n: d for fw in BUILTIN for n, d in param_docs(get_framework(fw).config).items()}}
        for param_name, doc in docs.items():
            if f"Has{_camel(param_name)}" == name:
                mixin = type(name, (Params,), {"__module__": __name__, "__doc__": f"Mixin for the param {param_name}."})
                _OLD_MIXINS[name] = declare_params(mixin, {param_name: doc})
    if name in _OLD_MIXINS:
        return _OLD_MIXINS[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SparkEstimator", "SparkModel", "EstimatorParams", "declare_params", "MODEL_PARAMS", "ModelT"]
