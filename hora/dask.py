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
``dataframe.convert-string``. ``KerasEstimator`` and ``LightningEstimator`` (and their
models) are imported on first access (importing ``hora.dask`` imports neither TensorFlow
nor Lightning).
"""

from __future__ import annotations

import importlib
from typing import Any

from hora.estimators.faces import sklearn as dask_face
from hora.estimators.callbacks import BestModelCheckpoint, Callback, EarlyStopping, MLflowLogger
from hora.estimators.faces.sklearn import active_client
from hora.estimators.frameworks.torch.codec import TORCH

TorchEstimator, TorchModel = dask_face.build(TORCH, __name__, "TorchEstimator", "TorchModel")

#: classes built on first access: name -> (framework module, descriptor, estimator name, model name)
_LAZY = {
    "KerasEstimator": ("hora.estimators.frameworks.keras.codec", "KERAS", "KerasEstimator", "KerasModel"),
    "KerasModel": ("hora.estimators.frameworks.keras.codec", "KERAS", "KerasEstimator", "KerasModel"),
    "LightningEstimator": ("hora.estimators.frameworks.lightning", "LIGHTNING", "LightningEstimator", "LightningModel"),
    "LightningModel": ("hora.estimators.frameworks.lightning", "LIGHTNING", "LightningEstimator", "LightningModel"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, descriptor, est_name, model_name = _LAZY[name]
        try:
            framework = getattr(importlib.import_module(module), descriptor)
        except ImportError as exc:
            raise ImportError(f"hora.dask.{name} needs {module}, which cannot be imported: {exc}") from exc
        est, model = dask_face.build(framework, __name__, est_name, model_name)
        globals().update({est_name: est, model_name: model})
        return globals()[name]
    raise AttributeError(f"module 'hora.dask' has no attribute {name!r}")


__all__ = ["TorchEstimator", "TorchModel", "KerasEstimator", "KerasModel", "LightningEstimator", "LightningModel",
           "Callback", "EarlyStopping", "BestModelCheckpoint", "MLflowLogger", "active_client"]
