"""The engine-neutral fit pipeline shared by ``hora.spark`` and ``hora.dask`` (and any framework).

:func:`fit` = validate on the driver (params, columns, one forward pass on a small
sample) -> :func:`hora.store.materialize` -> :func:`hora.runners.run` of
:func:`hora.estimators.worker.train_worker` on a frozen :class:`TrainSpec` ->
collect history and final weights -> :class:`FitResult`. Nothing here knows
which face called it beyond the ``backend`` name, or which framework trains
beyond the :class:`~hora.estimators.trainer.Trainer` hooks.
"""

from __future__ import annotations

import logging
import secrets
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from hora.errors import DataError, WorkerFailedError
from hora.estimators.params import EstimatorConfig, default_output_cols
from hora.estimators.spec import TrainSpec, freeze
from hora.estimators.trainer import Trainer

logger = logging.getLogger(__name__)

#: Rows taken from the DataFrame for the driver-side forward-pass check.
SAMPLE_ROWS = 16


@dataclass
class FitResult:
    """What a fit produced (the faces wrap it into their Model classes).

    Attributes:
        model: the trained framework model (on the CPU, in eval mode).
        history: one dict of metrics per epoch (``epoch``, ``loss``, ``val_loss``, ``val_<metric>``...).
        run_id: the run's id in the store (pass it again to resume).
        output_shapes: per-row shape of each model output, one per label.
        dataset: the DatasetInfo trained on.
        num_proc: ranks that trained.
        extra: rank 0's extra results and ``timings`` (seconds: ``prepare_s``, ``materialize_s``,
            ``train_s`` (the whole worker job, start to end), ``epochs_s`` (inside epochs), ``collect_s``).
    """

    model: Any
    history: list[dict[str, float]]
    run_id: str
    output_shapes: list[tuple[int, ...]]
    dataset: Any = None
    num_proc: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# DataFrames (Spark, Dask, pandas): which engine, which columns, a small numpy sample
# ---------------------------------------------------------------------------------------
def engine_of(df: Any) -> str:
    """``"spark"``, ``"dask"`` or ``"pandas"``.

    Raises:
        DataError: ``df`` is none of those.
    """
    mod = type(df).__module__
    if mod.startswith("pyspark."):
        return "spark"
    if mod.startswith("dask.") or mod.startswith("dask_expr"):
        return "dask"
    try:
        import pandas as pd

        if isinstance(df, pd.DataFrame):
            return "pandas"
    except ImportError:  # pragma: no cover
        pass
    raise DataError(f"fit needs a Spark, Dask or pandas DataFrame, got {type(df).__module__}.{type(df).__name__}")


def columns_of(df: Any) -> list[str]:
    """Column names of a Spark, Dask or pandas DataFrame."""
    return [str(c) for c in df.columns]


def check_columns(df: Any, config: EstimatorConfig) -> None:
    """Every configured column exists in ``df``.

    Raises:
        DataError: names each missing column, its role, and the columns there are.
    """
    have = set(columns_of(df))
    roles = [("feature_cols", c) for c in config.feature_cols] + [("label_cols", c) for c in config.label_cols]
    if config.sample_weight_col is not None:
        roles.append(("sample_weight_col", config.sample_weight_col))
    if isinstance(config.validation, str):
        roles.append(("validation", config.validation))
    missing = [(role, c) for role, c in roles if c not in have]
    if missing:
        desc = ", ".join(f"{c!r} ({role})" for role, c in missing)
        raise DataError(f"column(s) {desc} not in the DataFrame; its columns are {sorted(have)}")


def series_to_numpy(values: Any, vector_dtype: str = "float32") -> np.ndarray:
    """A pandas Series (or sequence) of scalars, lists, numpy arrays or Spark ML vectors -> one numpy array.

    Raises:
        DataError: rows of different lengths.
    """
    import pandas as pd

    if isinstance(values, pd.Series):
        if values.dtype != object:
            return values.to_numpy()
        values = values.tolist()
    items = list(values)
    if not items:
        return np.zeros((0,), dtype=vector_dtype)
    first = items[0]
    if hasattr(first, "toArray"):  # pyspark.ml.linalg Dense/SparseVector
        rows = [v.toArray() for v in items]
    elif isinstance(first, (list, tuple, np.ndarray)):
        rows = [np.asarray(v) for v in items]
    else:
        return np.asarray(items)
    shapes = {r.shape for r in rows}
    if len(shapes) != 1:
        raise DataError(f"array values have different shapes {sorted(shapes)[:5]}; hora needs fixed-size arrays")
    out = np.stack(rows)
    if out.dtype.kind == "f":
        out = out.astype(vector_dtype, copy=False)
    return out


def sample_numpy(df: Any, columns: Sequence[str], rows: int = SAMPLE_ROWS) -> dict[str, np.ndarray]:
    """The first ``rows`` rows of ``columns`` as numpy arrays (for the driver-side forward pass).

    Raises:
        DataError: the DataFrame is empty.
    """
    engine = engine_of(df)
    columns = list(dict.fromkeys(columns))
    if engine == "spark":
        pdf = df.select(*columns).limit(rows).toPandas()
    elif engine == "dask":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "insufficient elements for head" when the first partition is small
            pdf = df[columns].head(rows, npartitions=min(df.npartitions, 4))
    else:
        pdf = df[columns].head(rows)
    if len(pdf) == 0:
        raise DataError("the DataFrame is empty: nothing to train on")
    out = {}
    for c in columns:
        arr = series_to_numpy(pdf[c])
        if arr.dtype.kind in "USO":
            hint = ""
            if engine == "dask":
                hint = (" (Dask turns object columns into strings unless "
                        "dask.config.set({'dataframe.convert-string': False}) is set when the frame is built)")
            raise DataError(f"column {c!r} holds {arr.dtype} values; hora needs numbers or fixed-size numeric arrays{hint}")
        out[c] = arr
    return out


def default_num_proc(engine: str, spark: Any = None, client: Any = None) -> int:
    """The number of ranks when ``num_proc`` is not set: Spark's default parallelism,
    the number of Dask workers, or 1."""
    if engine == "spark" and spark is not None:
        return max(1, int(spark.sparkContext.defaultParallelism))
    if engine == "dask" and client is not None:
        return max(1, len(client.scheduler_info().get("workers", {})))
    return 1


def new_run_id() -> str:
    """A fresh run id (``hora-<UTC time>-<hex>``)."""
    return time.strftime("hora-%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)


# ---------------------------------------------------------------------------------------
# the pipeline
# ---------------------------------------------------------------------------------------
def prepare(df: Any, config: EstimatorConfig, trainer: Trainer) -> dict[str, Any]:
    """Validate ``df`` and ``config`` on the driver, before anything is launched.

    Returns:
        ``{"output_shapes": ...}`` from the trainer's check.

    Raises:
        DataError: missing columns, empty DataFrame.
        ConfigError: model / optimizer / loss / label shape problems (see ``Trainer.check``).
    """
    check_columns(df, config)
    cols = list(config.feature_cols) + list(config.label_cols)
    sample = sample_numpy(df, cols)
    return trainer.check(config, sample)


def fit(
    df: Any,
    config: EstimatorConfig,
    trainer: Trainer,
    backend: str | None = None,
    spark: Any = None,
    client: Any = None,
) -> FitResult:
    """Train ``config.model`` on ``df`` with ``config.num_proc`` ranks and return the result.

    Args:
        df: a Spark, Dask or pandas DataFrame.
        config: the validated estimator configuration.
        trainer: the framework hooks.
        backend: the runner backend (``"spark"``, ``"dask"``, ``"local"``); default from the engine.
        spark, client: the SparkSession / distributed.Client to run on.

    Raises:
        DataError, ConfigError: bad data or configuration (before anything starts).
        StoreError: the store cannot be written.
        WorkerFailedError: a training worker failed (rank and remote traceback attached).
    """
    from hora import runners
    from hora.store import materialize

    engine = engine_of(df)
    backend = backend or ("local" if engine == "pandas" else engine)
    t_prepare = time.monotonic()
    checked = prepare(df, config, trainer)
    timings = {"prepare_s": time.monotonic() - t_prepare}
    num_proc = config.num_proc or default_num_proc(engine, spark, client)
    seed = config.random_seed if config.random_seed is not None else 0
    run_id = config.run_id or new_run_id()
    store = config.store
    resume = config.run_id is not None
    if resume and store.list_checkpoints(run_id):
        logger.info("run %s has checkpoints in %s: fit resumes from the last one", run_id, store.url)

    t0 = time.monotonic()
    info = materialize(
        df,
        store,
        feature_cols=list(config.feature_cols),
        label_cols=list(config.label_cols),
        sample_weight_col=config.sample_weight_col,
        validation=config.validation,
        num_proc=num_proc,
        seed=seed,
    )
    timings["materialize_s"] = time.monotonic() - t0
    logger.info(
        "dataset %s (%d train rows, %d val rows) %s in %.1f s",
        info.fingerprint, info.train_rows, info.val_rows, "reused" if info.reused else "materialized", time.monotonic() - t0,
    )
    common = freeze({"callbacks": list(config.callbacks or []), "transformation_fn": config.transformation_fn})
    spec = TrainSpec(
        trainer=trainer,
        payload=trainer.freeze_payload(config),
        common=common,
        store=store,
        dataset=info,
        run_id=run_id,
        num_proc=num_proc,
        feature_cols=tuple(config.feature_cols),
        label_cols=tuple(config.label_cols),
        sample_weight_col=config.sample_weight_col,
        input_shapes=tuple(tuple(s) for s in config.input_shapes) if config.input_shapes else None,
        batch_size=config.batch_size,
        val_batch_size=config.val_batch_size or config.batch_size,
        epochs=config.epochs,
        train_steps_per_epoch=config.train_steps_per_epoch,
        validation_steps_per_epoch=config.validation_steps_per_epoch,
        shuffle=config.shuffle,
        shuffle_buffer_size=config.shuffle_buffer_size,
        seed=seed,
        backward_passes_per_step=config.backward_passes_per_step,
        use_gpu=config.use_gpu,
        verbose=config.verbose,
        lr_scaling=config.lr_scaling,
        learning_rate=config.learning_rate,
        loss_weights=tuple(config.loss_weights) if config.loss_weights else None,
        resume=True,
    )
    from hora.estimators.worker import train_worker

    t1 = time.monotonic()
    results = runners.run(
        train_worker,
        args=(spec,),
        num_proc=num_proc,
        backend=backend,
        env=dict(config.backend_env or {}),
        start_timeout=config.start_timeout,
        run_id=run_id,
        store=store,
        verbose=config.verbose,
        spark=spark,
        client=client,
    )
    timings["train_s"] = time.monotonic() - t1
    logger.info("training on %d ranks took %.1f s", num_proc, timings["train_s"])
    first = results[0] if results else None
    if not isinstance(first, dict) or "weights" not in first:
        raise WorkerFailedError(f"rank 0 returned no trained weights (got {type(first).__name__})", rank=0)
    t2 = time.monotonic()
    model = trainer.load_model(spec.payload, first["weights"])
    timings["collect_s"] = time.monotonic() - t2
    epoch_times = [h.get("epoch_time_s", 0.0) for h in first["history"][first.get("start_epoch", 0):]]
    timings["epochs_s"] = float(sum(epoch_times))
    return FitResult(
        model=model,
        history=list(first["history"]),
        run_id=run_id,
        output_shapes=[tuple(s) for s in checked["output_shapes"]],
        dataset=info,
        num_proc=num_proc,
        extra={**{k: v for k, v in first.items() if k not in ("weights", "history")}, "timings": timings},
    )


def output_cols_for(label_cols: Sequence[str], output_cols: Sequence[str] | None) -> list[str]:
    """The prediction column names (see :func:`hora.estimators.params.default_output_cols`)."""
    return default_output_cols(label_cols, output_cols)


__all__ = ["fit", "prepare", "FitResult", "check_columns", "sample_numpy", "series_to_numpy", "engine_of", "new_run_id"]
