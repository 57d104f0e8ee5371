"""``hora.spark.lightning`` (Horovod's ``horovod.spark.lightning``): the Lightning estimator on Spark.

Not built yet: it needs :mod:`hora.lightning` (a Lightning Strategy over hora's
DistributedOptimizer and a worker-side fit of a LightningModule on hora's reader
batches), which is being written separately.
"""

from __future__ import annotations

from typing import Any

_MISSING = ("hora.spark.lightning.{name} is not implemented yet: the Lightning estimator needs hora.lightning "
            "(a Lightning Strategy over hora's DistributedOptimizer and a worker-side fit of a LightningModule on "
            "hora reader batches), which is not in this build; use hora.spark.TorchEstimator with the module's "
            "torch.nn.Module meanwhile")


def __getattr__(name: str) -> Any:
    if name in ("TorchEstimator", "TorchModel", "LightningEstimator", "LightningModel"):
        raise NotImplementedError(_MISSING.format(name=name))
    raise AttributeError(f"module 'hora.spark.lightning' has no attribute {name!r}")
