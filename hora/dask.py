"""hora on Dask: estimators with scikit-learn conventions that train on the active ``distributed.Client``.

>>> from distributed import Client, LocalCluster
>>> from hora.dask import TorchEstimator
>>> from hora.store import Store
>>> client = Client(LocalCluster(n_workers=2))
>>> est = TorchEstimator(num_proc=2, store=Store.create("/tmp/hora-store"), model=net,
...                      optimizer=torch.optim.Adam(net.parameters(), 1e-3), loss=torch.nn.MSELoss(),
...                      feature_cols=["features"], label_cols=["y"], batch_size=64, epochs=5)
>>> model = est.fit(ddf)            # hora.dask.TorchModel
>>> model.predict(ddf).compute(); model.save("s3://bucket/models/m1")

A frame of many scalar columns feeds one model input through a feature group:
``feature_cols=[["x0", "x1", ..., "x63"]]``. Array columns work under Dask's default
``dataframe.convert-string``. Importing ``hora.dask`` imports neither TensorFlow nor
Lightning: a fit, a transform or a load of their estimators does.
"""

from typing import Any, Callable, Literal, Sequence

from hora.estimators.callbacks import BestModelCheckpoint, Callback, EarlyStopping, MLflowLogger
from hora.estimators.faces.sklearn import DaskEstimator, DaskModel, active_client
from hora.estimators.frameworks.keras.codec import KERAS
from hora.estimators.frameworks.lightning import LIGHTNING
from hora.estimators.param_info import keyword_params
from hora.estimators.frameworks.torch.codec import TORCH


class TorchModel(DaskModel):
    """A ``torch.nn.Module`` fitted by :class:`TorchEstimator`: ``model_`` is the trained module.

    ``transform`` / ``predict`` (and a classifier's ``predict_proba``) on Dask, pandas and Ray
    frames; ``save(url)`` / ``TorchModel.load(url)`` at any Store URL. See
    :class:`hora.estimators.faces.sklearn.DaskModel` for its attributes.
    """

    framework = TORCH


class KerasModel(DaskModel):
    """A ``keras.Model`` fitted by :class:`KerasEstimator`: ``model_`` is the trained model.

    ``transform`` / ``predict`` (and a classifier's ``predict_proba``) on Dask, pandas and Ray
    frames; ``save(url)`` / ``KerasModel.load(url)`` at any Store URL. See
    :class:`hora.estimators.faces.sklearn.DaskModel` for its attributes.
    """

    framework = KERAS


class LightningModel(DaskModel):
    """A ``LightningModule`` fitted by :class:`LightningEstimator`: ``model_`` is the trained module.

    ``transform`` / ``predict`` (and a classifier's ``predict_proba``) on Dask, pandas and Ray
    frames; ``save(url)`` / ``LightningModel.load(url)`` at any Store URL. See
    :class:`hora.estimators.faces.sklearn.DaskModel` for its attributes.
    """

    framework = LIGHTNING


class TorchEstimator(DaskEstimator[TorchModel]):
    """Train a ``torch.nn.Module`` data-parallel on a Dask DataFrame (scikit-learn conventions);
    ``fit`` returns a :class:`TorchModel`.

    ``__init__`` stores its keywords (``get_params`` / ``set_params`` work on them); ``fit``
    validates them and trains on the active ``distributed.Client`` (a pandas frame on local
    processes, a Ray Dataset on Ray). The model is called as ``model(*inputs)``, one tensor
    per ``feature_cols`` entry, and returns one output per label column; ``optimizer`` is a
    ``torch.optim`` optimizer over its parameters and ``loss`` a loss module or function.
    Besides the parameters every framework shares
    (:class:`~hora.estimators.params.EstimatorConfig`), Torch's own
    (:class:`~hora.estimators.frameworks.torch.codec.TorchConfig`): ``lr_scheduler``, ``precision``,
    gradient clipping, ``class_weight``, ``strategy`` and Horovod's ``train_minibatch_fn`` /
    ``loss_constructors``.
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


class KerasEstimator(DaskEstimator[KerasModel]):
    """Train a Keras 3 model (TensorFlow backend) data-parallel on a Dask DataFrame (scikit-learn
    conventions); ``fit`` returns a :class:`KerasModel`.

    ``__init__`` stores its keywords (``get_params`` / ``set_params`` work on them); ``fit``
    validates them and trains on the active ``distributed.Client``. ``model`` is a
    ``keras.Model``, ``optimizer`` a Keras optimizer (or its name), ``loss`` a Keras loss (or
    its name), one per label. Besides the parameters every framework shares
    (:class:`~hora.estimators.params.EstimatorConfig`), Keras' own
    (:class:`~hora.estimators.frameworks.keras.codec.KerasConfig`): ``custom_objects``,
    ``checkpoint_callback`` and Horovod's ``tensorflow_dataset_prefetch_buffer_size``.
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


class LightningEstimator(DaskEstimator[LightningModel]):
    """Train a ``LightningModule`` data-parallel on a Dask DataFrame (scikit-learn conventions);
    ``fit`` returns a :class:`LightningModel`.

    ``__init__`` stores its keywords (``get_params`` / ``set_params`` work on them); ``fit``
    validates them and trains on the active ``distributed.Client`` with Lightning's own loop.
    Besides the parameters every framework shares
    (:class:`~hora.estimators.params.EstimatorConfig`), Lightning's own
    (:class:`~hora.estimators.frameworks.lightning.LightningConfig`): ``trainer_args``, ``data_module``,
    ``logger``, ``profiler``, ``terminate_on_nan``, ``log_every_n_steps`` and Horovod's
    data-loader knobs (accepted, ignored with a warning).
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


__all__ = ["TorchEstimator", "TorchModel", "KerasEstimator", "KerasModel", "LightningEstimator", "LightningModel",
           "Callback", "EarlyStopping", "BestModelCheckpoint", "MLflowLogger", "active_client"]
