"""hora for PyTorch Lightning 2.6 (``lightning`` and ``pytorch_lightning``, both import names).

In a training script, started by ``hora run -np 4 python train.py``::

    import lightning as L            # or: import pytorch_lightning as pl
    import hora.lightning
    trainer = L.Trainer(strategy=hora.lightning.Strategy(), max_epochs=10)
    trainer.fit(model, train_loader)

:class:`Strategy` (also ``HoraStrategy``) is what Lightning's removed ``HorovodStrategy``
was: gradients averaged through :func:`hora.torch.DistributedOptimizer`, rank 0's model and
optimizer broadcast, ``sync_dist`` metrics and Lightning's collectives through hora,
checkpoints by rank 0.

For the estimators' workers: :func:`fit_module` trains a LightningModule on per-rank
batches and returns its weights, per-epoch history and Lightning checkpoint;
:func:`validate_trainer_args` checks a module and its ``trainer_args`` on the driver.

Importing this package imports neither Lightning nor torch; names load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Strategy": "hora.lightning.strategy",
    "HoraStrategy": "hora.lightning.strategy",
    "strategy_class": "hora.lightning.strategy",
    "fit_module": "hora.lightning.fit",
    "FitResult": "hora.lightning.fit",
    "EpochEnd": "hora.lightning.fit",
    "BatchEnd": "hora.lightning.fit",
    "TrainerConfig": "hora.lightning.validate",
    "validate_trainer_args": "hora.lightning.validate",
    "MIN_PL_VERSION": "hora.lightning._compat",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the defining submodule on first use of a public name (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
