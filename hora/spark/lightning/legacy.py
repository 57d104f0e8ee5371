"""``hora.spark.lightning.legacy`` (Horovod's path): ``to_lightning_module``, a plain torch module as a LightningModule.

The Lightning ``TorchEstimator`` applies it itself to a plain ``torch.nn.Module`` given with
``optimizer=`` and ``loss=``; see :mod:`hora.lightning.plain_module`.
"""

from hora.lightning.plain_module import to_lightning_module

__all__ = ["to_lightning_module"]
