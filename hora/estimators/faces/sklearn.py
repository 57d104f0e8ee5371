"""The Dask / scikit-learn face: the bases of every ``hora.dask`` estimator and its fitted model.

scikit-learn conventions: ``__init__`` only stores its arguments, ``get_params`` /
``set_params`` work on them, validation happens in ``fit``, fitted attributes end in
``_``, and ``fit`` returns the fitted model. Training runs on the active
``distributed.Client`` (a pandas frame trains on local processes, a Ray Dataset on Ray),
or where ``backend`` says (``"ray"``: Ray actors, see :mod:`hora.estimators.data.ray_dataset`),
through the shared :func:`hora.estimators.driver.fit.fit`. Each framework's two classes are written in
:mod:`hora.dask` (``class TorchEstimator(DaskEstimator[TorchModel])`` with ``framework = TORCH`` and
its keyword-only ``__init__``); there is no framework code here.

``predict`` / ``transform`` keep the rows of the frame they get, in its order and with
its index (``dd.from_pandas`` sorts a frame by its index: join predictions to the
pandas frame by index, not by position). On a Ray Dataset both return lazy Ray
Datasets: ``transform`` every input column plus the predictions, ``predict`` the
prediction column(s) only (in the input's row order only where Ray Data keeps it:
``DataContext.execution_options.preserve_order``; use ``transform`` to keep each
prediction with its row).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, ClassVar, Generic, Sequence, TypeVar

import numpy as np

from hora.errors import ConfigError
from hora.estimators.driver import fit as core
from hora.estimators.driver import persistence
from hora.estimators.faces.history import plot_history
from hora.estimators.data.columns import inference_columns
from hora.estimators.data.frames import check_face, source_of
from hora.estimators.framework import Framework
from hora.estimators.param_info import keyword_params, params_section
from hora.estimators.params import ParamError, check_param_names, default_output_cols, mllib_aliases, param_defaults
from hora.estimators.tasks import CausalLMHead, ClassifierHead, head_codec
from hora.estimators.driver.transform import DEFAULT_PREDICT_BATCH, predict_source
from hora.store.ray_source import RaySource
from hora.store.sources import DaskSource, PandasSource, Source

logger = logging.getLogger(__name__)

_SHOWN_BY_TYPE = ("model", "optimizer", "store", "backend")


def active_client() -> Any:
    """The active ``distributed.Client``.

    Raises:
        ConfigError: distributed is not installed, or no Client is active.
    """
    try:
        from distributed import default_client
    except ImportError as exc:
        raise ConfigError("hora.dask needs the 'distributed' package: pip install distributed") from exc
    try:
        return default_client()
    except ValueError as exc:
        raise ConfigError(
            "hora.dask estimators' fit needs an active distributed.Client: create one first, "
            "e.g. `from distributed import Client; client = Client(cluster)`"
        ) from exc


#: the fitted model class an estimator's ``fit`` returns
ModelT = TypeVar("ModelT", bound="DaskModel")


class DaskEstimator(Generic[ModelT]):
    """scikit-learn style estimator over the shared core, the base of each framework's ``hora.dask`` estimator.

    A subclass names its :class:`~hora.estimators.framework.Framework` (``framework = TORCH``)
    and its fitted model class (``model_class``), and writes its keyword-only ``__init__`` out
    (a test checks it against the framework's config class); ``help()`` of the subclass lists
    every parameter with its doc.
    """

    framework: ClassVar[Framework]
    model_class: ClassVar[type]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "framework" in cls.__dict__:  # a framework's estimator: every parameter's doc in help()
            cls.__doc__ = params_section(cls.__doc__, cls.framework.config, "Parameters (keyword arguments)")

    @keyword_params
    def __init__(self, **params: Any) -> None:
        del self._input_kwargs  # scikit-learn's rule: __init__ sets the parameters only
        for name, default in param_defaults(self.framework.config).items():
            setattr(self, name, params.get(name, default))

    def _check_keywords(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` under hora's names (MLlib's aliases mapped), each a parameter of the framework.

        Raises:
            ParamError: an unknown parameter.
        """
        params = mllib_aliases(params)
        check_param_names(self.framework.config, params, type(self).__name__)
        return params

    # scikit-learn protocol ---------------------------------------------------------------
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor parameters, as given (scikit-learn protocol)."""
        return {name: getattr(self, name) for name in param_defaults(self.framework.config)}

    def set_params(self, **params: Any) -> "DaskEstimator[ModelT]":
        """Set constructor parameters; returns self.

        Raises:
            ParamError: an unknown parameter name.
        """
        for name, value in self._check_keywords(params).items():
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = param_defaults(self.framework.config)
        changed = {k: v for k, v in self.get_params().items() if v is not defaults[k] and v != defaults[k]}
        shown = ", ".join(f"{k}={type(v).__name__ if k in _SHOWN_BY_TYPE else repr(v)}" for k, v in changed.items())
        return f"{type(self).__name__}({shown})"

    def _config(self) -> Any:
        return self.framework.make_config(self.get_params())

    def fit(self, ddf: Any, y: Any = None) -> ModelT:
        """Train on a Dask DataFrame with the active ``distributed.Client`` (a pandas frame on local
        processes, a Ray Dataset on Ray actors), or on the launcher ``backend`` names (``"ray"``...).

        Raises:
            ConfigError: bad parameters, no active Client for Dask's launcher, Ray missing or not
                initialized for Ray's (checked before anything starts).
            DataError: missing columns, label shapes that do not match the model.
            WorkerFailedError: a training worker failed.
        """
        source = check_face(ddf, "hora.dask", f"{type(self).__name__}.fit")
        if y is not None:
            raise ConfigError("pass labels as label_cols of the DataFrame, not as y")
        config = self._config()
        launcher = source.launcher if config.backend is None else config.backend
        client = active_client() if launcher == DaskSource.launcher else None  # the ranks run on Dask's workers
        result = core.fit(source, config, self.framework, client=client)
        return self.model_class._from_result(result, config)


class DaskModel:
    """A fitted model on the Dask face: ``transform`` / ``predict`` on Dask or pandas frames, ``save`` / ``load``.

    Attributes:
        model_: the trained framework model. ``history_``: per-epoch metrics.
        run_id_: the run's id in the store. ``output_shapes_``: per-row output shapes.
        feature_cols_, label_cols_, output_cols_, input_shapes_: how columns map to the model.
        task_: ``"classification"``, ``"regression"`` or ``"causal_lm"``. For a classifier: ``classes_`` (the
            label values seen in training, sorted), ``predict`` gives class labels,
            ``predict_proba`` probabilities (one column per class of the model), and
            ``transform`` adds the ``prediction_col_`` (class index), ``probability_col_`` and
            ``raw_prediction_col_`` (arrays) columns. ``"causal_lm"``: ``transform`` adds each row's
            mean token loss (``output_cols_[0]``, default ``loss``) and, when fitted with
            ``generate_kwargs``, the generated text (``output_cols_[1]``, default ``generated``).
    """

    framework: ClassVar[Framework]

    def __init__(
        self,
        *,
        model: Any,
        feature_cols: Sequence[Any],
        label_cols: Sequence[str],
        output_shapes: Sequence[Sequence[int]],
        output_cols: Sequence[str] | None = None,
        input_shapes: Any = None,
        history: Sequence[dict[str, float]] | None = None,
        run_id: str | None = None,
        batch_size: int = DEFAULT_PREDICT_BATCH,
        classifier: dict[str, Any] | None = None,
        prediction_col: str = "prediction",
        probability_col: str = "probability",
        raw_prediction_col: str = "rawPrediction",
        inference_columns: dict[str, Any] | None = None,
    ) -> None:
        self.model_ = model
        #: the fit's decode_fn, max_length, truncation and collate_fn, which transform applies (None: defaults)
        self.inference_columns_ = inference_columns
        self.feature_cols_ = [c if isinstance(c, str) else list(c) for c in feature_cols]
        self.label_cols_ = list(label_cols)
        self._head = ClassifierHead.from_meta(classifier)
        if isinstance(self._head, CausalLMHead):  # a causal LM's columns: its per-row loss (and generated text)
            output_shapes, output_cols = self._head.output_shapes(), self._head.output_cols(output_cols)
        self.output_shapes_ = [tuple(s) for s in output_shapes]
        self.output_cols_ = default_output_cols(self.label_cols_, output_cols)
        if len(self.output_cols_) != len(self.output_shapes_):
            raise ConfigError(f"{len(self.output_cols_)} output columns for {len(self.output_shapes_)} model outputs")
        self.input_shapes_ = [list(s) for s in input_shapes] if input_shapes else None
        self.history_ = [dict(h) for h in (history or [])]
        self.run_id_ = run_id
        self.batch_size = batch_size
        self.task_ = self._head.task if self._head is not None else "regression"
        self.prediction_col_, self.probability_col_, self.raw_prediction_col_ = (
            prediction_col, probability_col, raw_prediction_col)
        if isinstance(self._head, ClassifierHead):
            self.classes_ = np.asarray(self._head.seen or range(self._head.classes))
        #: seconds spent in each phase of the fit that produced this model (not persisted)
        self.fit_timings_: dict[str, float] = {}
        self._files: dict[str, bytes] | None = None

    @classmethod
    def _from_result(cls, result: core.FitResult, config: Any) -> "DaskModel":
        model = cls(model=result.model, feature_cols=config.feature_cols, label_cols=config.label_cols,
                    output_shapes=result.output_shapes, output_cols=config.output_cols,
                    input_shapes=result.input_shapes, history=result.history, run_id=result.run_id,
                    classifier=result.classifier.to_meta() if result.classifier else None,
                    prediction_col=config.prediction_col, probability_col=config.probability_col,
                    raw_prediction_col=config.raw_prediction_col, inference_columns=inference_columns(config, result.dataset))
        model.fit_timings_ = dict(result.extra.get("timings", {}))
        return model

    def _model_files(self) -> dict[str, bytes]:
        if self._files is None:
            self._files = self.framework.codec.serialize(self.model_)
        return self._files

    def transform(self, df: Any) -> Any:
        """``df`` (Dask or pandas) with one prediction column per label (``output_cols_``), rows and index
        kept; a Ray Dataset gives a lazy Ray Dataset with the prediction columns added.

        Raises:
            DataError: a feature column is missing or an output column already exists.
        """
        codec, cols, shapes = self._outputs()
        source = check_face(df, "hora.dask", f"{type(self).__name__}.transform")
        return predict_source(source, codec, self.model_, self._model_files, self.feature_cols_, self.input_shapes_,
                              cols, shapes, self.batch_size, columns=self.inference_columns_)

    def _outputs(self) -> tuple[Any, list[str], list[tuple[int, ...]]]:
        """(codec, output columns, per-row output shapes) of :meth:`transform`: a classifier's three columns."""
        if self._head is None:
            return self.framework.codec, self.output_cols_, self.output_shapes_
        codec = head_codec(self.framework.codec, self._head)
        if isinstance(self._head, CausalLMHead):
            return codec, self.output_cols_, self.output_shapes_
        return codec, [self.raw_prediction_col_, self.probability_col_, self.prediction_col_], codec.output_shapes()

    def predict(self, df: Any) -> Any:
        """The predictions only: a Series for one output, a DataFrame for several (the frame's rows and
        index); for a Ray Dataset, a lazy Ray Dataset of the prediction column(s). A classifier's are
        its class labels (the values of ``classes_``)."""
        source = source_of(df)
        out = self.transform(source)
        if isinstance(self._head, ClassifierHead):
            return _picked(source, out, [self.prediction_col_], np.asarray(self.classes_).dtype)
        return _picked(source, out, self.output_cols_)

    def predict_proba(self, df: Any) -> Any:
        """A classifier's class probabilities: a numpy array ``(rows, classes)`` of a pandas frame, a Dask
        Array (chunks per partition) of a Dask frame, a lazy Ray Dataset of the probability column of a
        Ray Dataset.

        Raises:
            ConfigError: the model is not a classifier.
        """
        if not isinstance(self._head, ClassifierHead):
            raise ConfigError(f"{type(self).__name__}.predict_proba needs a classifier (task='classification'); "
                              "this model was fitted as a regressor")
        source = source_of(df)
        return _probabilities(source, self.transform(source), self.probability_col_, self._head.classes)

    def plot_history(self, metrics: Sequence[str] | None = None) -> Any:
        """A matplotlib Figure of the training / validation curves of ``history_``."""
        return plot_history(self.history_, metrics, title=self.run_id_)

    def _meta(self) -> dict[str, Any]:
        return {"face": "dask", "class": persistence.class_path(self), "feature_cols": self.feature_cols_,
                "label_cols": self.label_cols_, "output_cols": self.output_cols_,
                "output_shapes": [list(s) for s in self.output_shapes_], "input_shapes": self.input_shapes_,
                "history": self.history_, "run_id": self.run_id_, "batch_size": self.batch_size,
                "classifier": self._head.to_meta() if self._head is not None else None,
                "prediction_col": self.prediction_col_, "probability_col": self.probability_col_,
                "raw_prediction_col": self.raw_prediction_col_}

    def save(self, url: str, overwrite: bool = True) -> None:
        """Save to a folder at any Store URL (``file://``, ``s3://``, ``memory://``...).

        Raises:
            StoreError: the location cannot be written (or holds a model and ``overwrite`` is False).
        """
        persistence.save_fitted(url, self.framework.codec, self.model_, self._meta(), overwrite=overwrite,
                                objects={"inference_columns": self.inference_columns_})

    def save_pretrained(self, path: str, **kwargs: Any) -> None:
        """A Hugging Face model in the Hugging Face format (see :meth:`hora.estimators.frameworks.torch.hf.HFModule.save_pretrained`)."""
        save = getattr(self.model_, "save_pretrained", None)
        if save is None:
            raise ConfigError(f"save_pretrained writes a Hugging Face model, but this fitted model is a "
                              f"{type(self.model_).__name__}; persist it with save()/write()")
        save(path, **kwargs)

    @classmethod
    def load(cls, url: str) -> "DaskModel":
        """Load a model written by :meth:`save`.

        Raises:
            StoreError: nothing saved there, or unreadable.
        """
        _, model, meta, objects = persistence.load_fitted(url)
        return cls(model=model, feature_cols=meta["feature_cols"], label_cols=meta["label_cols"],
                   output_shapes=meta["output_shapes"], output_cols=meta["output_cols"],
                   input_shapes=meta.get("input_shapes"), history=meta.get("history"), run_id=meta.get("run_id"),
                   batch_size=int(meta.get("batch_size", DEFAULT_PREDICT_BATCH)), classifier=meta.get("classifier"),
                   prediction_col=meta.get("prediction_col", "prediction"),
                   probability_col=meta.get("probability_col", "probability"),
                   raw_prediction_col=meta.get("raw_prediction_col", "rawPrediction"),
                   inference_columns=objects.get("inference_columns"))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_files"] = None
        return state

    def __deepcopy__(self, memo: dict) -> "DaskModel":
        import copy

        new = copy.copy(self)
        new.model_ = self.framework.codec.clone(self.model_)
        new.history_ = copy.deepcopy(self.history_, memo)
        new._files = None
        return new


# what predict and predict_proba give back, per engine ------------------------------------
@functools.singledispatch
def _picked(source: Source, out: Any, cols: list[str], dtype: Any = None) -> Any:
    """The columns ``cols`` of ``out`` (the transform of ``source``'s frame): one column as a Series
    (of ``dtype`` when given), several as a frame."""
    picked = out[cols[0]] if len(cols) == 1 else out[cols]
    return picked if dtype is None else picked.astype(dtype)


@_picked.register(RaySource)
def _(source: RaySource, out: Any, cols: list[str], dtype: Any = None) -> Any:
    return out.select_columns(cols)  # a lazy Ray Dataset of those columns


@functools.singledispatch
def _probabilities(source: Source, out: Any, col: str, classes: int) -> Any:
    """The probability column ``col`` of ``out`` (the transform of ``source``'s frame) as ``predict_proba``
    gives it: a Dask Array of a Dask frame."""
    return _dask_proba(out[col], classes)


@_probabilities.register(PandasSource)
def _(source: PandasSource, out: Any, col: str, classes: int) -> Any:
    probs = out[col]
    return np.stack(probs.to_numpy()) if len(probs) else np.zeros((0, classes))


@_probabilities.register(RaySource)
def _(source: RaySource, out: Any, col: str, classes: int) -> Any:
    return out.select_columns([col])


def _dask_proba(probs: Any, classes: int) -> Any:
    """A Dask Series of probability arrays as a Dask Array ``(rows, classes)``, one chunk per partition."""
    import dask
    import dask.array as da

    def _stack(s: Any) -> np.ndarray:
        return np.stack(s.to_numpy()).astype(np.float64) if len(s) else np.zeros((0, classes))

    parts = [da.from_delayed(dask.delayed(_stack)(d), shape=(np.nan, classes), dtype=np.float64)
             for d in probs.to_delayed()]
    return da.concatenate(parts, axis=0, allow_unknown_chunksizes=True)


__all__ = ["DaskEstimator", "DaskModel", "ModelT", "active_client", "ParamError"]
