"""hora on Dask: estimators with scikit-learn conventions that train on the active ``distributed.Client``.

>>> from distributed import Client, LocalCluster
>>> from hora.dask import TorchEstimator
>>> from hora.store import Store
>>> client = Client(LocalCluster(n_workers=2))
>>> est = TorchEstimator(num_proc=2, store=Store.create("/tmp/hora"), model=net,
...                      optimizer=torch.optim.Adam(net.parameters(), 1e-3), loss=torch.nn.MSELoss(),
...                      feature_cols=["features"], label_cols=["y"], batch_size=64, epochs=5)
>>> model = est.fit(ddf)            # hora.dask.TorchModel
>>> model.predict(ddf).compute(); model.save("s3://bucket/models/m1")

``KerasEstimator`` / ``KerasModel`` come from :mod:`hora.estimators.keras`, imported on
first access (importing ``hora.dask`` never imports TensorFlow).
"""

from __future__ import annotations

from typing import Any

from hora.estimators.callbacks import BestModelCheckpoint, Callback, EarlyStopping
from hora.estimators.dask_estimator import TorchEstimator, TorchModel, active_client

_LAZY = {"KerasEstimator": "DaskKerasEstimator", "KerasModel": "DaskKerasModel"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        try:
            module = importlib.import_module("hora.estimators.keras")
        except ImportError as exc:
            raise ImportError(f"hora.dask.{name} needs hora.estimators.keras and TensorFlow/Keras: {exc}") from exc
        for attr in (_LAZY[name], name):
            if hasattr(module, attr):
                return getattr(module, attr)
        raise AttributeError(f"hora.estimators.keras defines neither {_LAZY[name]} nor {name}")
    raise AttributeError(f"module 'hora.dask' has no attribute {name!r}")


__all__ = ["TorchEstimator", "TorchModel", "KerasEstimator", "KerasModel", "Callback", "EarlyStopping",
           "BestModelCheckpoint", "active_client"]
