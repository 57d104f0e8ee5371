"""``hora.spark.torch.estimator`` (Horovod's path): ``TorchEstimator``, ``TorchModel`` and ``EstimatorParams``.

The Spark face (:mod:`hora.estimators.faces.spark`) of the Torch framework
(:mod:`hora.estimators.frameworks.torch`); ``from hora.spark import TorchEstimator`` is the same class.
"""

from typing import Any, Callable, Literal, Sequence

from hora.estimators.param_info import keyword_params
from hora.estimators.faces.spark import SparkEstimator, SparkModel
from hora.estimators.frameworks.torch.codec import TORCH
from hora.horovod_internals import module_getattr
from hora.spark.common.params import EstimatorParams


class TorchModel(SparkModel):
    """A ``torch.nn.Module`` fitted by :class:`TorchEstimator`, as an MLlib ``Model``.

    ``getModel()`` is the trained module; ``transform`` adds its predictions to a Spark
    DataFrame, batched on the executors; ``write().save(path)`` / ``TorchModel.load(path)``
    persist it. See :class:`hora.estimators.faces.spark.SparkModel` for its Params.
    """

    framework = TORCH


class TorchEstimator(SparkEstimator[TorchModel]):
    """Train a ``torch.nn.Module`` data-parallel on a Spark DataFrame; ``fit`` returns a :class:`TorchModel`.

    An MLlib ``Estimator``: it works in ``Pipeline``, ``CrossValidator`` and
    ``TrainValidationSplit``, and every keyword is also a Spark Param with ``get<Name>`` /
    ``set<Name>`` accessors (``getBatchSize()``). The model is called as ``model(*inputs)``,
    one tensor per ``feature_cols`` entry, and returns one output per label column;
    ``optimizer`` is a ``torch.optim`` optimizer over its parameters and ``loss`` a loss
    module or function (one per label). Besides the parameters every framework shares
    (:class:`~hora.estimators.params.EstimatorConfig`), Torch's own
    (:class:`~hora.estimators.frameworks.torch.codec.TorchConfig`): ``lr_scheduler``, ``precision``,
    gradient clipping, ``class_weight``, ``strategy`` (``"ddp"``, ``"fsdp"``, ZeRO) and
    Horovod's ``train_minibatch_fn`` / ``loss_constructors``.

    Raises (from ``fit``):
        ConfigError, DataError: bad params or data, before any worker starts.
        WorkerFailedError: a training worker failed.
    """

    framework = TORCH
    model_class = TorchModel

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
        task: Literal["classification", "regression", "causal_lm"] | None = None,
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
        train_minibatch_fn: Callable | None = None,
        loss_constructors: Sequence[Callable] | None = None,
        lr_scheduler: Callable | None = None,
        lr_scheduler_interval: Literal["epoch", "step"] = "epoch",
        precision: Literal["32", "bf16-mixed", "16-mixed"] = "32",
        gradient_clip_norm: float | None = None,
        gradient_clip_value: float | None = None,
        class_weight: dict[int, float] | Sequence[float] | None = None,
        strategy: Literal["hora", "zero1", "zero2", "ddp", "fsdp"] = "hora",
        tokenizer: Any = None,
        merge_adapters: bool = True,
        generate_kwargs: dict[str, Any] | None = None,
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
        task: Literal["classification", "regression", "causal_lm"] | None = None,
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
        train_minibatch_fn: Callable | None = None,
        loss_constructors: Sequence[Callable] | None = None,
        lr_scheduler: Callable | None = None,
        lr_scheduler_interval: Literal["epoch", "step"] = "epoch",
        precision: Literal["32", "bf16-mixed", "16-mixed"] = "32",
        gradient_clip_norm: float | None = None,
        gradient_clip_value: float | None = None,
        class_weight: dict[int, float] | Sequence[float] | None = None,
        strategy: Literal["hora", "zero1", "zero2", "ddp", "fsdp"] = "hora",
        tokenizer: Any = None,
        merge_adapters: bool = True,
        generate_kwargs: dict[str, Any] | None = None,
    ) -> "TorchEstimator":
        """Set any of the estimator's Params by keyword; returns self.

        Raises:
            ParamError: an unknown parameter (Horovod's names say what to use instead).
        """
        return self._set(**self._input_kwargs)


__getattr__ = module_getattr(__name__, {
    "_torch_param_serialize": "hora saves an estimator's JSON Params as Spark metadata and pickles the others as "
                              "side files (hora.estimators.faces.spark); backend is never saved",
})

__all__ = ["TorchEstimator", "TorchModel", "EstimatorParams"]
