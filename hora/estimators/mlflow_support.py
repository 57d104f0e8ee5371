"""MLflow plumbing of :class:`hora.estimators.callbacks.MLflowLogger` (mlflow is imported only here, when used)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Iterator

from hora.errors import ConfigError

#: seconds the driver's reachability check may take per request
CHECK_TIMEOUT = 10
_MAX_PARAM = 6000  # MLflow's limit on a param value


def _mlflow() -> Any:
    try:
        import mlflow
    except ImportError as exc:
        raise ConfigError("MLflowLogger needs mlflow: pip install 'hora[mlflow]' (or mlflow / mlflow-skinny)") from exc
    return mlflow


@contextlib.contextmanager
def _quick_requests() -> Iterator[None]:
    """MLflow's HTTP client without its minutes of retries, for the driver's check."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")}
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(CHECK_TIMEOUT)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def resolve_run(tracking_uri: str | None, experiment: str | None, run_id: str | None,
                run_name: str | None = None) -> tuple[str, str, bool]:
    """On the driver: ``(tracking URI, MLflow run id, whether hora created the run)``.

    Without ``tracking_uri`` the driver's tracking URI is used and, without ``run_id``,
    its active run; otherwise a run is created in ``experiment`` (made if missing).

    Raises:
        ConfigError: mlflow missing, the tracking URI cannot be reached, the run does not exist.
    """
    mlflow = _mlflow()
    from mlflow.tracking import MlflowClient

    uri = tracking_uri or mlflow.get_tracking_uri()
    client = MlflowClient(uri)
    with _quick_requests():
        try:
            client.search_experiments(max_results=1)
        except Exception as exc:
            raise ConfigError(f"MLflowLogger: the MLflow tracking URI {uri!r} cannot be reached: "
                              f"{type(exc).__name__}: {str(exc)[:300]}") from exc
        if run_id is None and tracking_uri is None and mlflow.active_run() is not None:
            run_id = mlflow.active_run().info.run_id
        if run_id is not None:
            try:
                client.get_run(run_id)
            except Exception as exc:
                raise ConfigError(f"MLflowLogger: no MLflow run {run_id!r} at {uri!r}: {str(exc)[:300]}") from exc
            return uri, run_id, False
        if experiment is None and tracking_uri is None:
            from mlflow.tracking.fluent import _get_experiment_id

            experiment_id = _get_experiment_id()
        else:
            name = experiment or "Default"
            found = client.get_experiment_by_name(name)
            experiment_id = found.experiment_id if found is not None else client.create_experiment(name)
        run = client.create_run(experiment_id, run_name=run_name)
        return uri, run.info.run_id, True


def log_params(client: Any, run_id: str, params: dict[str, Any]) -> None:
    """Log ``params`` (JSON values as text, cut to MLflow's limit) to ``run_id``."""
    from mlflow.entities import Param

    items = []
    for key, value in sorted(params.items()):
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        items.append(Param(key, text[:_MAX_PARAM]))
    for start in range(0, len(items), 100):  # log_batch takes at most 100 params
        client.log_batch(run_id, params=items[start:start + 100])


def log_files(client: Any, run_id: str, files: dict[str, bytes], artifact_path: str) -> None:
    """Write ``files`` to a temporary folder and log them as artifacts of ``run_id`` under ``artifact_path``."""
    with tempfile.TemporaryDirectory(prefix="hora-mlflow-") as tmp:
        for name, data in files.items():
            with open(os.path.join(tmp, name), "wb") as fh:
                fh.write(data)
        client.log_artifacts(run_id, tmp, artifact_path=artifact_path)


__all__ = ["resolve_run", "log_params", "log_files"]
