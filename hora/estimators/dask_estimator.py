"""The Dask / scikit-learn face: ``hora.dask.TorchEstimator`` and ``hora.dask.TorchModel``.

scikit-learn conventions: ``__init__`` only stores its arguments, ``get_params`` /
``set_params`` work on them, validation happens in ``fit``, fitted attributes end
in ``_``, and ``fit`` returns the fitted :class:`TorchModel`. Training runs on the
active ``distributed.Client`` through the engine-neutral :func:`hora.estimators.core.fit`.
"""

from __future__ import annotations

import copy
import inspect
import logging
from typing import Any, Sequence

from hora.errors import ConfigError
from hora.estimators import core, persistence
from hora.estimators.base import plot_history
from hora.estimators.params import PARAM_DEFAULTS, EstimatorConfig, default_output_cols
from hora.estimators.trainer import Trainer
from hora.estimators.transform import DEFAULT_PREDICT_BATCH, dask_transform, predict_frame

logger = logging.getLogger(__name__)


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
            "hora.dask.TorchEstimator.fit needs an active distributed.Client: create one first, "
            "e.g. `from distributed import Client; client = Client(cluster)`"
        ) from exc


class DaskEstimatorBase:
    """scikit-learn style estimator over the shared core; subclasses set :attr:`trainer_class` and :attr:`model_class`."""

    trainer_class: type[Trainer] = Trainer
    model_class: type = object
    _param_names: tuple[str, ...] = tuple(PARAM_DEFAULTS)

    def __init__(self, **params: Any) -> None:
        unknown = set(params) - set(self._param_names)
        if unknown:
            raise TypeError(f"{type(self).__name__} got unknown parameters {sorted(unknown)}")
        for name in self._param_names:
            setattr(self, name, params.get(name, PARAM_DEFAULTS[name]))

    # scikit-learn protocol ---------------------------------------------------------------
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor parameters, as given (scikit-learn protocol)."""
        return {name: getattr(self, name) for name in self._param_names}

    def set_params(self, **params: Any) -> "DaskEstimatorBase":
        """Set constructor parameters; returns self.

        Raises:
            ConfigError: an unknown parameter name.
        """
        for name, value in params.items():
            if name not in self._param_names:
                raise ConfigError(f"{type(self).__name__} has no parameter {name!r}; it has {list(self._param_names)}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.get_params().items() if v is not PARAM_DEFAULTS[k] and v != PARAM_DEFAULTS[k]}
        shown = ", ".join(f"{k}={type(v).__name__ if k in ('model', 'optimizer', 'store') else repr(v)}" for k, v in changed.items())
        return f"{type(self).__name__}({shown})"

    def _config(self) -> EstimatorConfig:
        return EstimatorConfig.from_params(self.get_params())

    def fit(self, ddf: Any, y: Any = None) -> Any:
        """Train on a Dask DataFrame with the active ``distributed.Client``; returns the fitted model.

        Raises:
            ConfigError: bad parameters, or no active Client (checked before anything starts).
            DataError: missing columns, label shapes that do not match the model.
            WorkerFailedError: a training worker failed.
        """
        if y is not None:
            raise ConfigError("pass labels as label_cols of the DataFrame, not as y")
        config = self._config()
        engine = core.engine_of(ddf)
        client = active_client() if engine == "dask" else None
        trainer = self.trainer_class()
        result = core.fit(ddf, config, trainer, backend="dask" if engine == "dask" else "local", client=client)
        return self.model_class._from_result(result, config, trainer)


class DaskModelBase:
    """A fitted model on the Dask face: ``transform`` / ``predict`` on Dask or pandas frames, ``save`` / ``load``.

    Attributes:
        model_: the trained framework model. ``history_``: per-epoch metrics.
        run_id_: the run's id in the store. ``output_shapes_``: per-row output shapes.
        feature_cols_, label_cols_, output_cols_, input_shapes_: how columns map to the model.
    """

    trainer_class: type[Trainer] = Trainer

    def __init__(
        self,
        model: Any,
        feature_cols: Sequence[str],
        label_cols: Sequence[str],
        output_shapes: Sequence[Sequence[int]],
        output_cols: Sequence[str] | None = None,
        input_shapes: Any = None,
        history: Sequence[dict[str, float]] | None = None,
        run_id: str | None = None,
        batch_size: int = DEFAULT_PREDICT_BATCH,
    ) -> None:
        self.model_ = model
        self.feature_cols_ = list(feature_cols)
        self.label_cols_ = list(label_cols)
        self.output_shapes_ = [tuple(s) for s in output_shapes]
        self.output_cols_ = default_output_cols(self.label_cols_, output_cols)
        if len(self.output_cols_) != len(self.output_shapes_):
            raise ConfigError(f"{len(self.output_cols_)} output columns for {len(self.output_shapes_)} model outputs")
        self.input_shapes_ = [list(s) for s in input_shapes] if input_shapes else None
        self.history_ = [dict(h) for h in (history or [])]
        self.run_id_ = run_id
        self.batch_size = batch_size
        #: seconds spent in each phase of the fit that produced this model (not persisted)
        self.fit_timings_: dict[str, float] = {}
        self._files: dict[str, bytes] | None = None

    @classmethod
    def _from_result(cls, result: core.FitResult, config: EstimatorConfig, trainer: Trainer) -> "DaskModelBase":
        model = cls._build(result, config)
        model.fit_timings_ = dict(result.extra.get("timings", {}))
        return model

    @classmethod
    def _build(cls, result: core.FitResult, config: EstimatorConfig) -> "DaskModelBase":
        return cls(
            model=result.model,
            feature_cols=config.feature_cols,
            label_cols=config.label_cols,
            output_shapes=result.output_shapes,
            output_cols=config.output_cols,
            input_shapes=config.input_shapes,
            history=result.history,
            run_id=result.run_id,
        )

    def _model_files(self) -> dict[str, bytes]:
        if self._files is None:
            self._files = self.trainer_class().serialize_model(self.model_)
        return self._files

    def transform(self, df: Any) -> Any:
        """``df`` (Dask or pandas) with one prediction column per label (``output_cols_``).

        Raises:
            DataError: a feature column is missing or an output column already exists.
        """
        trainer = self.trainer_class()
        if core.engine_of(df) == "pandas":
            return predict_frame(trainer, self.model_, df, self.feature_cols_, self.input_shapes_,
                                 self.output_cols_, self.output_shapes_, self.batch_size)
        return dask_transform(df, trainer, self._model_files(), self.feature_cols_, self.input_shapes_,
                              self.output_cols_, self.output_shapes_, self.batch_size)

    def predict(self, df: Any) -> Any:
        """The predictions only: a Dask (or pandas) Series for one output, a DataFrame for several."""
        out = self.transform(df)
        if len(self.output_cols_) == 1:
            return out[self.output_cols_[0]]
        return out[self.output_cols_]

    def plot_history(self, metrics: Sequence[str] | None = None) -> Any:
        """A matplotlib Figure of the training / validation curves of ``history_``."""
        return plot_history(self.history_, metrics, title=self.run_id_)

    def _meta(self) -> dict[str, Any]:
        return {
            "face": "dask",
            "class": persistence.class_path(self),
            "feature_cols": self.feature_cols_,
            "label_cols": self.label_cols_,
            "output_cols": self.output_cols_,
            "output_shapes": [list(s) for s in self.output_shapes_],
            "input_shapes": self.input_shapes_,
            "history": self.history_,
            "run_id": self.run_id_,
            "batch_size": self.batch_size,
        }

    def save(self, url: str, overwrite: bool = True) -> None:
        """Save to a folder at any Store URL (``file://``, ``s3://``, ``memory://``...).

        Raises:
            StoreError: the location cannot be written (or holds a model and ``overwrite`` is False).
        """
        persistence.save_fitted(url, self.trainer_class(), self.model_, self._meta(), overwrite=overwrite)

    @classmethod
    def load(cls, url: str) -> "DaskModelBase":
        """Load a model written by :meth:`save`.

        Raises:
            StoreError: nothing saved there, or unreadable.
        """
        _, model, meta, _ = persistence.load_fitted(url)
        return cls(
            model=model,
            feature_cols=meta["feature_cols"],
            label_cols=meta["label_cols"],
            output_shapes=meta["output_shapes"],
            output_cols=meta["output_cols"],
            input_shapes=meta.get("input_shapes"),
            history=meta.get("history"),
            run_id=meta.get("run_id"),
            batch_size=int(meta.get("batch_size", DEFAULT_PREDICT_BATCH)),
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_files"] = None
        return state

    def __deepcopy__(self, memo: dict) -> "DaskModelBase":
        new = copy.copy(self)
        new.model_ = copy.deepcopy(self.model_, memo)
        new.history_ = copy.deepcopy(self.history_, memo)
        new._files = None
        return new


def _signature() -> inspect.Signature:
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d) for n, d in PARAM_DEFAULTS.items()]
    return inspect.Signature(params)


DaskEstimatorBase.__init__.__signature__ = _signature()  # type: ignore[attr-defined]


class TorchModel(DaskModelBase):
    """A fitted PyTorch model (see :class:`DaskModelBase`); ``model_`` is the trained ``nn.Module``."""

    from hora.estimators.torch_trainer import TorchTrainer as trainer_class  # noqa: N813


class TorchEstimator(DaskEstimatorBase):
    """Train a PyTorch model data-parallel on a Dask DataFrame (scikit-learn conventions).

    Parameters are those of :data:`hora.estimators.params.PARAM_DOCS` (``num_proc``,
    ``store``, ``model``, ``optimizer``, ``loss``, ``feature_cols``, ``label_cols``,
    ``batch_size``, ``epochs``, ``validation``, ``lr_scaling``...). ``fit(ddf)`` returns
    a :class:`TorchModel`.
    """

    from hora.estimators.torch_trainer import TorchTrainer as trainer_class  # noqa: N813

    model_class = TorchModel


__all__ = ["DaskEstimatorBase", "DaskModelBase", "TorchEstimator", "TorchModel", "active_client"]
