"""The engine-neutral fit pipeline shared by ``hora.spark`` and ``hora.dask`` (and every framework).

:func:`fit` = validate on the driver (params, columns, feature groups, one forward pass
on a small sample, the callbacks' own checks) -> :func:`hora.store.materialize` ->
:func:`hora.runners.run` of :func:`hora.estimators.worker.loop.train_worker` on a frozen
:class:`TrainSpec` -> collect history and final weights -> :class:`FitResult`. Nothing
here knows which face called it beyond the engine of the frame, or which framework
trains beyond its :class:`~hora.estimators.framework.Framework` descriptor.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from hora.errors import ConfigError, DataError, WorkerFailedError
from hora.estimators.callbacks import Callback
from hora.estimators.data.frames import (
    SAMPLE_ROWS, fixed_batch_shapes, sample_dataset, sample_numpy, source_of,
)
from hora.estimators.framework import CheckResult, Framework
from hora.estimators.params import EstimatorConfig
from hora.estimators.spec import TrainSpec, freeze
from hora.estimators.tasks import CausalLMHead, ClassifierHead, check_labels, resolve_task, sample_for_check
from hora.store.sources import DaskSource, PandasSource, Source

logger = logging.getLogger(__name__)


@dataclass
class FitResult:
    """What a fit produced (the faces wrap it into their Model classes).

    Attributes:
        model: the trained framework model (on the CPU, in eval mode).
        history: one dict of metrics per epoch (``epoch``, ``loss``, ``val_loss``, ``val_<metric>``...).
        run_id: the run's id in the store (pass it again to resume).
        output_shapes: per-row shape of each model output, one per label.
        input_shapes: the shapes feature inputs are reshaped to (given or derived from the model).
        dataset: the DatasetInfo trained on.
        num_proc: ranks that trained.
        extra: rank 0's extra results and ``timings`` (seconds: ``prepare_s``, ``materialize_s``,
            ``train_s`` (the whole worker job, start to end), ``epochs_s`` (inside epochs), ``collect_s``).
        classifier: how a classifier's output becomes its columns, or a causal LM's head (None: regression; see
            :mod:`hora.estimators.tasks`).
    """

    model: Any
    history: list[dict[str, float]]
    run_id: str
    output_shapes: list[tuple[int, ...]]
    input_shapes: list[list[int]] | None = None
    dataset: Any = None
    num_proc: int = 1
    extra: dict[str, Any] = field(default_factory=dict)
    classifier: ClassifierHead | CausalLMHead | None = None


def prepare(source: Source, config: EstimatorConfig, framework: Framework) -> CheckResult:
    """Validate the frame of ``source`` and ``config`` on the driver, before anything is launched (see
    :func:`prepare_task`)."""
    return prepare_task(source, config, framework)[0]


def prepare_task(source: Source | None, config: EstimatorConfig, framework: Framework,
                 dataset: Any = None) -> tuple[CheckResult, ClassifierHead | CausalLMHead | None]:
    """Validate the frame of ``source`` (its :class:`~hora.store.sources.Source`, decided at the top of
    :func:`fit`; or, ``source`` None, the materialized ``dataset``) and ``config`` on the driver, before
    anything is launched; with the fit's task (:func:`hora.estimators.tasks.resolve_task`: a classifier's
    head, or None for outputs as they are). The model is checked on a sample of the data as a rank's batch
    has it: ``batch_size`` rows when an ``input_shapes`` entry fixes the batch dimension (no ``-1``,
    Horovod's ``[[2]]`` with ``batch_size=1``), else a few rows.

    Raises:
        DataError: missing columns, empty DataFrame, string columns.
        ConfigError: model / optimizer / loss / label shape problems (see ``ModelCodec.check``),
            a feature group of mixed dtypes or with a non-scalar member, a callback's own check.
    """
    prepare_model = getattr(framework.codec, "prepare_model", None)  # e.g. a Hugging Face model's adapter
    if prepare_model is not None:
        prepare_model(source, config, dataset)
    features = config.features
    roles = [("feature_cols", c) for c in features.columns] + [("label_cols", c) for c in config.label_cols]
    if config.sample_weight_col is not None:
        roles.append(("sample_weight_col", config.sample_weight_col))
    rows = config.batch_size if fixed_batch_shapes(config.input_shapes) else SAMPLE_ROWS
    if dataset is not None:
        sample = sample_dataset(config.store, dataset, roles, rows, config)
    else:
        if isinstance(config.validation, str):
            roles.append(("validation", config.validation))
        sample = sample_numpy(source, features.columns + list(config.label_cols), rows=rows, config=config,
                              roles=roles)  # a batch, once the columns of every role are there
    features.check_sample(sample)
    stacked = features.stack(sample)
    checked = framework.codec.check(config, sample_for_check(config, framework.name, stacked))
    label_shape = np.asarray(stacked[config.label_cols[0]]).shape[1:] if config.label_cols else ()  # causal_lm: none
    head = resolve_task(config, framework.name, checked.output_shapes, label_shape=label_shape)
    for cb in config.callbacks or []:
        prepare_cb = getattr(cb, "prepare", None)
        if callable(prepare_cb):
            prepare_cb(config)
    return checked, head


def _resolve_launch(config: EstimatorConfig, where: type[Source], spark: Any, client: Any) -> tuple[Any, Any]:
    """Where and how the ranks start (:func:`hora.runners.resolve` of ``backend``): on the launcher of the
    frame's engine ``where`` (its Source class) unless ``backend`` names one; ``use_gpu`` checked.

    Raises:
        ConfigError: a bad ``backend``, options or slots, GPUs missing (before anything is written).
    """
    from hora import runners

    launcher, launch = runners.resolve(
        config.backend, default=where.launcher, default_num_proc=where.default_num_proc, num_proc=config.num_proc,
        min_num_proc=config.min_num_proc, max_failures=config.max_failures, env=config.backend_env,
        start_timeout=config.start_timeout, verbose=config.verbose, spark=spark, client=client,
        task_cpus=config.task_cpus, use_gpu=config.use_gpu)
    if config.use_gpu:  # local: the driver's GPUs; Dask: each worker's, named (Spark/Ray check in their launchers)
        from hora.estimators.devices import check_gpus_before_launch

        check_gpus_before_launch(True, launcher, launch.num_proc, client=client)
    return launcher, launch


def _prestart(launcher: Any, launch: Any) -> Callable[[], None] | None:
    """Let the launcher prepare the ranks' hosts (:meth:`hora.runners.Launcher.prestart`),
    overlapped with the store check and the materialization; never fails the fit.

    Returns:
        None when it was started now; for a launcher whose prestart takes the task slots
        (Spark: a short job, which a training stage started right after it waits for), the
        callable that starts it, for :func:`hora.store.materialize` to call only when it
        writes the data: before a run whose data is reused it would only delay the ranks.
    """
    def start() -> None:
        try:
            launcher.prestart(launch.num_proc, launch.env)
        except Exception as exc:
            logger.debug("no prestart of the ranks' hosts: %s", exc)

    if launcher.prestart_takes_slots:
        return start
    start()
    return None


def _check_store_reach(launcher: Any, store: Any) -> None:
    """Ranks on Spark executors read the dataset and write checkpoints there: check the store first.

    Raises:
        StoreError: the executors cannot use ``store`` (e.g. ``memory://``, this client's memory only).
    """
    from hora.runners.launchers.spark import SparkLauncher

    if isinstance(launcher, SparkLauncher):
        from hora.store.spark_source import check_executors_reach

        check_executors_reach(launcher.spark, store)


def _run_workers(spec: TrainSpec, launcher: Any, launch: Any) -> list[Any]:
    from hora import runners
    from hora.estimators.worker.loop import train_worker

    try:
        return runners.run(train_worker, args=(spec,), run_id=spec.run_id, store=spec.store, backend=launcher,
                           **launch.run_kwargs())
    except WorkerFailedError as exc:
        if all(part in exc.message for part in _DAMAGED):  # a rank read a stored file whose bytes changed
            raise DataError(f"run {spec.run_id}: {exc.message}") from exc
        raise


#: what a rank's failure says when a stored file no longer matches its checksum (hora.store.integrity)
_DAMAGED = (" raised DataError: ", " is damaged: ")


def fit(source: Source | None, config: EstimatorConfig, framework: Framework, spark: Any = None, client: Any = None,
        dataset: Any = None, load_checkpoint: Callable[[str], Any] | None = None) -> FitResult:
    """Train ``config.model`` on the frame of ``source`` and return the result.

    Args:
        source: the :class:`~hora.store.sources.Source` of a Spark, Dask or pandas DataFrame (pandas
            trains on local processes) or of a Ray Dataset (trains on Ray actors unless
            ``config.backend`` says otherwise), decided once by the face
            (:func:`~hora.estimators.data.frames.check_face`) and passed down as it is; a frame
            itself is decided here (:func:`~hora.estimators.data.frames.source_of`); None with
            ``dataset``.
        config: the validated estimator configuration (of ``framework.config``).
        framework: the framework descriptor.
        spark, client: the SparkSession / distributed.Client to run on.
        dataset: a materialized :class:`~hora.store.DatasetInfo` in ``config.store`` to train on
            instead of a frame (``fit_on_parquet``): nothing is materialized; the ranks run on
            Spark when ``spark`` is given, else on local processes.
        load_checkpoint: reads ``(epoch, bytes)`` of a run's last checkpoint on the driver when the fit
            resumes one (default ``config.store.latest_checkpoint``; the Spark face passes its
            estimator's method, Horovod's ``_load_checkpoint``).

    Raises:
        DataError, ConfigError: bad data or configuration (before anything starts).
        StoreError: the store cannot be written.
        WorkerFailedError: a training worker failed (rank and remote traceback attached).
    """
    from hora.runners.spec import new_run_id
    from hora.store import materialize, prepared

    features = config.features
    if dataset is not None:
        source = None
    else:  # the frame's engine, decided once (a face's Source passes through), narrowed to the fit's columns
        source = (source if isinstance(source, Source) else source_of(source)).for_columns(
            features.columns + list(config.label_cols))
    # where the ranks run by default: the frame's engine; a prepared dataset's, the session's (Spark or local)
    where: type[Source] = type(source) if source is not None else (_spark_source() if spark is not None else PandasSource)
    t_prepare = time.monotonic()
    checked, head = prepare_task(source, config, framework, dataset=dataset)
    launcher, launch = _resolve_launch(config, where, spark, client)
    num_proc = launch.num_proc
    prestart = _prestart(launcher, launch)  # the ranks' warm servers import torch while the data is materialized
    timings = {"prepare_s": time.monotonic() - t_prepare}
    run_id = config.run_id or new_run_id()
    store = config.store
    latest = None
    if config.run_id is not None and store.list_checkpoints(run_id):
        latest = (load_checkpoint or store.latest_checkpoint)(run_id)  # the newest one that verifies
    if latest is not None:
        framework.codec.check_checkpoint(config, latest[1], f"the checkpoint of epoch {latest[0]} of run {run_id} "
                                                            f"in {store.url}")
        logger.info("run %s has checkpoints in %s: fit resumes from the last one", run_id, store.url)

    t0 = time.monotonic()
    _check_store_reach(launcher, store)
    if isinstance(source, DaskSource) and client is not None:  # a worker whose `import hora` finds a folder fails every task
        from hora.runners.launchers.dask import check_workers_import_hora

        check_workers_import_hora(client)
    info = dataset
    if dataset is None and framework.codec.trains_on_frame(config):
        info = materialize(source, store, feature_cols=features.columns, label_cols=list(config.label_cols),
                           sample_weight_col=config.sample_weight_col, validation=config.validation,
                           num_proc=num_proc * (config.partitions_per_process or 1), seed=config.seed,
                           label_nan=config.label_nan, compress_sparse_cols=bool(config.compress_sparse_cols),
                           before_write=prestart)
        logger.info("dataset %s (%d train rows, %d val rows) %s in %.1f s", info.fingerprint, info.train_rows,
                    info.val_rows, "reused" if info.reused else "materialized", time.monotonic() - t0)
        prepared.record(store, info)  # fit_on_parquet() trains on it again
    if info is not None:
        if isinstance(head, ClassifierHead):  # a classifier's labels: class indices, checked before any worker starts
            head = dataclasses.replace(head, seen=check_labels(store, info, config.label_cols[0], head.classes))
    timings["materialize_s"] = time.monotonic() - t0
    input_shapes = checked.input_shapes if checked.input_shapes is not None else config.input_shapes
    spec = TrainSpec(
        framework=framework,
        config=config.for_workers(input_shapes=input_shapes, task=head.task if head else "regression"),
        payload=framework.codec.freeze(config),
        common=freeze({"callbacks": [cb for cb in config.callbacks or [] if isinstance(cb, Callback)],
                       "transformation_fn": config.transformation_fn,  # the framework's own callbacks: codec
                       "decode_fn": config.decode_fn, "collate_fn": config.collate_fn}),
        store=store,
        dataset=info,
        run_id=run_id,
        num_proc=num_proc,
        output_shapes=tuple(tuple(s) for s in checked.output_shapes),
    )
    if config.verbose >= 1:
        from hora.runners.driver.progress import console, header_line

        console(header_line(run_id, num_proc, launcher))
    t1 = time.monotonic()
    results = _run_workers(spec, launcher, launch)
    timings["train_s"] = time.monotonic() - t1
    logger.info("training on %d ranks took %.1f s", num_proc, timings["train_s"])
    first = results[0] if results else None
    if not isinstance(first, dict) or "weights" not in first:
        raise WorkerFailedError(f"rank 0 returned no trained weights (got {type(first).__name__})", rank=0)
    t2 = time.monotonic()
    model = framework.codec.load(spec.payload, first["weights"])
    timings["collect_s"] = time.monotonic() - t2
    timings["epochs_s"] = float(sum(h.get("epoch_time_s", 0.0) for h in first["history"][first.get("start_epoch", 0):]))
    if config.verbose >= 1:
        from hora.estimators.worker.feed import summary_note
        from hora.runners.driver.progress import console, summary_line

        console(summary_line(run_id, list(first["history"]), store.url_for(store.layout.checkpoint_dir(run_id)),
                             store.url_for(store.layout.logs_dir(run_id))) + summary_note(first.get("data_wait_by_rank")))
    return FitResult(
        model=model,
        history=list(first["history"]),
        run_id=run_id,
        output_shapes=[tuple(s) for s in checked.output_shapes],
        input_shapes=input_shapes,
        dataset=info,
        num_proc=num_proc,
        extra={**{k: v for k, v in first.items() if k not in ("weights", "history")}, "timings": timings},
        classifier=head,
    )


def _spark_source() -> type[Source]:
    from hora.store.spark_source import SparkSource

    return SparkSource


__all__ = ["fit", "prepare", "prepare_task", "FitResult"]
