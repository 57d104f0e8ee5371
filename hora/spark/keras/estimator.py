"""``hora.spark.keras.estimator`` (Horovod's path): ``KerasEstimator``, ``KerasModel`` and ``EstimatorParams``.

The Spark face (:mod:`hora.estimators.faces.spark`) of the Keras framework
(:mod:`hora.estimators.frameworks.keras`). Importing this module does not import TensorFlow: a fit,
a transform or a load does.
"""

from typing import Any, Callable, Literal, Sequence

from hora.estimators.frameworks.keras.codec import KERAS
from hora.estimators.param_info import keyword_params
from hora.estimators.faces.spark import SparkEstimator, SparkModel
from hora.spark.common.params import EstimatorParams


class KerasModel(SparkModel):
    """A ``keras.Model`` fitted by :class:`KerasEstimator`, as an MLlib ``Model``.

    ``getModel()`` is the trained Keras model; ``transform`` adds its predictions to a Spark
    DataFrame, batched on the executors; ``write().save(path)`` / ``KerasModel.load(path)``
    persist it (the ``.keras`` format and the custom objects it needs). See
    :class:`hora.estimators.faces.spark.SparkModel` for its Params.
    """

    framework = KERAS


class KerasEstimator(SparkEstimator[KerasModel]):
    """Train a Keras 3 model (TensorFlow backend) data-parallel on a Spark DataFrame; ``fit`` returns a
    :class:`KerasModel`.

    An MLlib ``Estimator``: it works in ``Pipeline``, ``CrossValidator`` and
    ``TrainValidationSplit``, and every keyword is also a Spark Param with ``get<Name>`` /
    ``set<Name>`` accessors (``getBatchSize()``). ``model`` is a ``keras.Model``, ``optimizer``
    a Keras optimizer (or its name, ``"adam"``), ``loss`` a Keras loss (or its name,
    ``"mse"``), one per label; ``callbacks`` may hold Keras callbacks. Besides the parameters
    every framework shares (:class:`~hora.estimators.params.EstimatorConfig`), Keras' own
    (:class:`~hora.estimators.frameworks.keras.codec.KerasConfig`): ``custom_objects``,
    ``checkpoint_callback`` and Horovod's ``tensorflow_dataset_prefetch_buffer_size``.

    Raises (from ``fit``):
        ConfigError, DataError: bad params or data, before any worker starts.
        WorkerFailedError: a training worker failed.
    """

    framework = KERAS
    model_class = KerasModel

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
        custom_objects: dict | None = None,
        checkpoint_callback: Any = None,
        tensorflow_dataset_prefetch_buffer_size: int | None = None,
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
        custom_objects: dict | None = None,
        checkpoint_callback: Any = None,
        tensorflow_dataset_prefetch_buffer_size: int | None = None,
    ) -> "KerasEstimator":
        """Set any of the estimator's Params by keyword; returns self.

        Raises:
            ParamError: an unknown parameter (Horovod's names say what to use instead).
        """
        return self._set(**self._input_kwargs)


__all__ = ["KerasEstimator", "KerasModel", "EstimatorParams"]
