"""``hora.spark.lightning.estimator`` (Horovod's path): ``LightningEstimator``, ``LightningModel``,
``EstimatorParams`` and ``MIN_PL_VERSION``; ``TorchEstimator`` and ``TorchModel`` are Horovod's names of
the two classes.

The Spark face (:mod:`hora.estimators.faces.spark`) of the Lightning framework
(:mod:`hora.estimators.frameworks.lightning`); it needs Lightning 2.6 (``pip install 'hora[lightning]'``),
imported when training starts.
"""

from typing import Any, Callable, Literal, Sequence

from hora.estimators.frameworks.lightning import LIGHTNING
from hora.estimators.param_info import keyword_params
from hora.estimators.faces.spark import SparkEstimator, SparkModel
from hora.horovod_internals import module_getattr
from hora.lightning._compat import MIN_PL_VERSION
from hora.spark.common.params import EstimatorParams


class LightningModel(SparkModel):
    """A ``LightningModule`` fitted by :class:`LightningEstimator`, as an MLlib ``Model`` (Horovod's
    ``horovod.spark.lightning.TorchModel``; ``TorchModel`` here is the same class).

    ``getModel()`` is the trained module; ``transform`` adds its predictions to a Spark
    DataFrame, batched on the executors; ``write().save(path)`` / ``LightningModel.load(path)``
    persist it. See :class:`hora.estimators.faces.spark.SparkModel` for its Params.
    """

    framework = LIGHTNING


class LightningEstimator(SparkEstimator[LightningModel]):
    """Train a ``LightningModule`` data-parallel on a Spark DataFrame; ``fit`` returns a :class:`LightningModel`
    (Horovod's ``horovod.spark.lightning.TorchEstimator``; ``TorchEstimator`` here is the same class).

    An MLlib ``Estimator``: it works in ``Pipeline``, ``CrossValidator`` and
    ``TrainValidationSplit``, and every keyword is also a Spark Param with ``get<Name>`` /
    ``set<Name>`` accessors (``getBatchSize()``). Lightning's own loop trains ``model``
    (its ``training_step``, ``validation_step``, ``configure_optimizers``); a plain
    ``torch.nn.Module`` given with ``optimizer`` and ``loss`` is wrapped as Horovod did.
    Besides the parameters every framework shares
    (:class:`~hora.estimators.params.EstimatorConfig`), Lightning's own
    (:class:`~hora.estimators.frameworks.lightning.LightningConfig`): ``trainer_args``, ``data_module``,
    ``logger``, ``profiler``, ``terminate_on_nan``, ``log_every_n_steps`` and Horovod's
    data-loader knobs (accepted, ignored with a warning).

    Raises (from ``fit``):
        ConfigError, DataError: bad params or data (or no Lightning), before any worker starts.
        WorkerFailedError: a training worker failed.
    """

    framework = LIGHTNING
    model_class = LightningModel

    @keyword_params
    def __init__(
        self,
        *,
        num_proc: int | Sequence[int] | None = None,
        min_num_proc: int | None = None,
        max_failures: int = 0,
        checkpoint_every: int | str = 1,
        backend: Any = None,
        store: Any = None,
        model: Any = None,
        optimizer: Any = None,
        loss: Any = None,
        loss_weights: Sequence[float] | None = None,
        metrics: Any = None,
        feature_cols: Sequence[Any] | None = None,
        label_cols: Sequence[str] | None = None,
        sample_weight_col: str | None = None,
        label_nan: Literal["error", "drop", "keep"] = "error",
        validation: float | str | None = None,
        batch_size: int = 32,
        val_batch_size: int | None = None,
        epochs: int = 1,
        train_steps_per_epoch: int | None = None,
        validation_steps_per_epoch: int | None = None,
        shuffle: bool = True,
        shuffle_buffer_size: int | None = None,
        random_seed: int | None = None,
        run_id: str | None = None,
        callbacks: Sequence[Any] | None = None,
        gradient_compression: Any = None,
        backward_passes_per_step: int = 1,
        transformation_fn: Callable | None = None,
        decode_fn: Any = None,
        on_decode_error: Literal["raise", "skip"] = "raise",
        max_length: int | dict[str, int] | None = None,
        truncation: bool = True,
        sparse_format: Literal["csr", "dense"] = "csr",
        collate_fn: Callable | None = None,
        input_shapes: Sequence[Sequence[int]] | None = None,
        use_gpu: bool = False,
        task_cpus: int | None = None,
        verbose: int = 1,
        backend_env: dict[str, str] | None = None,
        lr_scaling: str = "linear",
        learning_rate: float | None = None,
        output_cols: Sequence[str] | None = None,
        task: Literal["classification", "regression"] | None = None,
        prediction_col: str = "prediction",
        probability_col: str = "probability",
        raw_prediction_col: str = "rawPrediction",
        start_timeout: float | None = None,
        partitions_per_process: int | None = None,
        inmemory_cache_all: bool = False,
        train_reader_num_workers: int | None = None,
        val_reader_num_workers: int | None = None,
        reader_pool_type: str | None = None,
        mp_start_method: str | None = None,
        compress_sparse_cols: bool | None = None,
        transformation_edit_fields: Any = None,
        transformation_removed_fields: Any = None,
        trainer_args: dict | None = None,
        data_module: Any = None,
        logger: Any = None,
        profiler: Any = None,
        terminate_on_nan: bool = False,
        log_every_n_steps: int | None = None,
        num_gpus: int | None = None,
        loader_num_epochs: int | None = None,
        debug_data_loader: bool | None = None,
        train_async_data_loader_queue_size: int | None = None,
        val_async_data_loader_queue_size: int | None = None,
    ) -> None:
        super().__init__(**self._input_kwargs)

    @keyword_params
    def setParams(  # noqa: N802 (MLlib's name)
        self,
        *,
        num_proc: int | Sequence[int] | None = None,
        min_num_proc: int | None = None,
        max_failures: int = 0,
        checkpoint_every: int | str = 1,
        backend: Any = None,
        store: Any = None,
        model: Any = None,
        optimizer: Any = None,
        loss: Any = None,
        loss_weights: Sequence[float] | None = None,
        metrics: Any = None,
        feature_cols: Sequence[Any] | None = None,
        label_cols: Sequence[str] | None = None,
        sample_weight_col: str | None = None,
        label_nan: Literal["error", "drop", "keep"] = "error",
        validation: float | str | None = None,
        batch_size: int = 32,
        val_batch_size: int | None = None,
        epochs: int = 1,
        train_steps_per_epoch: int | None = None,
        validation_steps_per_epoch: int | None = None,
        shuffle: bool = True,
        shuffle_buffer_size: int | None = None,
        random_seed: int | None = None,
        run_id: str | None = None,
        callbacks: Sequence[Any] | None = None,
        gradient_compression: Any = None,
        backward_passes_per_step: int = 1,
        transformation_fn: Callable | None = None,
        decode_fn: Any = None,
        on_decode_error: Literal["raise", "skip"] = "raise",
        max_length: int | dict[str, int] | None = None,
        truncation: bool = True,
        sparse_format: Literal["csr", "dense"] = "csr",
        collate_fn: Callable | None = None,
        input_shapes: Sequence[Sequence[int]] | None = None,
        use_gpu: bool = False,
        task_cpus: int | None = None,
        verbose: int = 1,
        backend_env: dict[str, str] | None = None,
        lr_scaling: str = "linear",
        learning_rate: float | None = None,
        output_cols: Sequence[str] | None = None,
        task: Literal["classification", "regression"] | None = None,
        prediction_col: str = "prediction",
        probability_col: str = "probability",
        raw_prediction_col: str = "rawPrediction",
        start_timeout: float | None = None,
        partitions_per_process: int | None = None,
        inmemory_cache_all: bool = False,
        train_reader_num_workers: int | None = None,
        val_reader_num_workers: int | None = None,
        reader_pool_type: str | None = None,
        mp_start_method: str | None = None,
        compress_sparse_cols: bool | None = None,
        transformation_edit_fields: Any = None,
        transformation_removed_fields: Any = None,
        trainer_args: dict | None = None,
        data_module: Any = None,
        logger: Any = None,
        profiler: Any = None,
        terminate_on_nan: bool = False,
        log_every_n_steps: int | None = None,
        num_gpus: int | None = None,
        loader_num_epochs: int | None = None,
        debug_data_loader: bool | None = None,
        train_async_data_loader_queue_size: int | None = None,
        val_async_data_loader_queue_size: int | None = None,
    ) -> "LightningEstimator":
        """Set any of the estimator's Params by keyword; returns self.

        Raises:
            ParamError: an unknown parameter (Horovod's names say what to use instead).
        """
        return self._set(**self._input_kwargs)


#: Horovod's names of the two classes (``horovod.spark.lightning.TorchEstimator``); models saved under
#: them (``hora.spark.lightning.TorchModel`` in Spark's metadata) load as these classes
TorchEstimator, TorchModel = LightningEstimator, LightningModel

__getattr__ = module_getattr(__name__, {
    "_torch_param_serialize": "hora saves an estimator's JSON Params as Spark metadata and pickles the others as "
                              "side files (hora.estimators.faces.spark); backend is never saved",
})

__all__ = ["LightningEstimator", "LightningModel", "TorchEstimator", "TorchModel", "EstimatorParams",
           "MIN_PL_VERSION"]
