"""A plain ``torch.nn.Module`` with its optimizer and losses as a ``LightningModule`` (Horovod's legacy Lightning path).

``hora.spark.lightning.legacy.to_lightning_module`` (Horovod's path) is :func:`to_lightning_module`.

Horovod's Lightning ``TorchEstimator`` also took a plain module with ``optimizer=`` and
``loss=`` (as its Torch estimator does) and wrapped it with :func:`to_lightning_module`.
hora does the same: the estimator wraps such a model when it is given, and the wrapper is a
real ``LightningModule`` (of the installed Lightning: ``lightning`` or ``pytorch_lightning``):

* ``forward`` calls the module, one input per feature column (as ``transform`` does);
* ``training_step`` / ``validation_step`` compute the loss of each label (outputs reshaped to
  the labels' shape) weighted by ``loss_weights``, logged as ``train_loss`` / ``val_loss``;
* with ``sample_weights_col``, each label's loss function is called with ``reduction='none'``
  and the loss is the mean of the per-row losses times their weights (Horovod's formula: not
  divided by the weights' sum, unlike hora's ``TorchEstimator``, which takes the weighted mean);
* ``configure_optimizers`` returns the given optimizer (bound to the module's parameters).
"""

from __future__ import annotations

from typing import Any, Sequence

from hora.errors import ConfigError

_CLASSES: dict[str, type] = {}
_PREFIX = "LegacyLightningModule_"


def __getattr__(name: str) -> Any:
    """The wrapper class of a Lightning package by its name (how a pickled wrapper finds its class again)."""
    if name.startswith(_PREFIX):
        return _module_class(name[len(_PREFIX):])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _module_class(package: str | None) -> type:
    """The wrapper class built on ``package``'s ``LightningModule`` (one per Lightning package, picklable by name)."""
    from hora.lightning._compat import resolve_flavor

    flavor = resolve_flavor(package)
    if flavor.name in _CLASSES:
        return _CLASSES[flavor.name]
    name = f"{_PREFIX}{flavor.name}"
    cls = type(name, (_LegacyMethods, flavor.pl.LightningModule), {"__module__": __name__, "__qualname__": name,
                                                                     "__doc__": _LegacyMethods.__doc__})
    globals()[name] = cls  # pickled by reference
    _CLASSES[flavor.name] = cls
    return cls


class _LegacyMethods:
    """A plain torch module with its optimizer and losses as a LightningModule (see the module docstring)."""

    def __init__(self, model: Any, optimizer: Any, loss_fns: Sequence[Any], loss_weights: Sequence[float],
                 feature_cols: Sequence[str], label_cols: Sequence[str], sample_weights_col: str | None) -> None:
        super().__init__()
        self._model = model
        self._optimizer = optimizer
        self._loss_fns = list(loss_fns)
        self._loss_weights = list(loss_weights)
        self._feature_cols = list(feature_cols)
        self._label_cols = list(label_cols)
        self._sample_weights_col = sample_weights_col or None

    @property
    def model(self) -> Any:
        """The wrapped torch module."""
        return self._model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._model(*args, **kwargs)

    def configure_optimizers(self) -> Any:
        return self._optimizer

    def training_step(self, batch: dict, batch_idx: int) -> Any:
        loss = self._step(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> Any:
        loss = self._step(batch)
        self.log("val_loss", loss)
        return loss

    def _step(self, batch: dict) -> Any:
        outputs = self(*[batch[c] for c in self._feature_cols])
        labels = [batch[c].float() for c in self._label_cols]
        weights = batch.get(self._sample_weights_col) if self._sample_weights_col else None
        outputs, labels = self._transform_outputs(outputs, labels)
        return self._calculate_loss(outputs, labels, sample_weights=weights)

    @staticmethod
    def _transform_outputs(outputs: Any, labels: list) -> tuple[list, list]:
        """One output per label, reshaped to its label's shape when they hold as many values."""
        if not isinstance(outputs, (list, tuple)):
            outputs = [outputs]
        return [o.reshape(lab.shape) if o.numel() == lab.numel() else o for o, lab in zip(outputs, labels)], labels

    def _calculate_loss(self, outputs: Sequence[Any], labels: Sequence[Any], sample_weights: Any = None) -> Any:
        """The sum over labels of ``loss_weight * loss``; with ``sample_weights``, each label's loss is
        the mean of its per-row losses (``reduction='none'``) times the rows' weights."""
        losses = []
        for output, label, fn, weight in zip(outputs, labels, self._loss_fns, self._loss_weights):
            if sample_weights is not None:
                per_row = fn(output, label, reduction="none").flatten() * sample_weights
                losses.append(per_row.mean() * weight)
            else:
                losses.append(fn(output, label) * weight)
        return sum(losses)


def to_lightning_module(model: Any, optimizer: Any, loss_fns: Sequence[Any] | Any,
                        loss_weights: Sequence[float] | None, feature_cols: Sequence[str], label_cols: Sequence[str],
                        sample_weights_col: str | None = None, validation: Any = None,
                        package: str | None = None) -> Any:
    """Wrap a plain torch module, its optimizer and its losses as a ``LightningModule`` (Horovod's legacy path).

    Args (Horovod's):
        model: the ``torch.nn.Module``.
        optimizer: its optimizer (returned by ``configure_optimizers``).
        loss_fns: one loss function per label (or one for all).
        loss_weights: a weight per label (default 1 each).
        feature_cols, label_cols: the batch keys of the inputs and labels.
        sample_weights_col: the batch key of per-row weights (None or '' for none).
        validation: accepted for Horovod's signature; the estimator splits the data.
        package: ``"lightning"`` or ``"pytorch_lightning"`` (default: the one in use).

    Raises:
        ConfigError: a loss that is not callable, or a count of losses or weights that is not one per label.
    """
    fns = list(loss_fns) if isinstance(loss_fns, (list, tuple)) else [loss_fns]
    labels = list(label_cols)
    if len(fns) == 1 and len(labels) > 1:
        fns = fns * len(labels)
    weights = [1.0] * len(fns) if loss_weights is None else [float(w) for w in loss_weights]
    if len(fns) != len(labels) or len(weights) != len(labels):
        raise ConfigError(f"to_lightning_module: {len(fns)} loss function(s) and {len(weights)} loss weight(s) for "
                          f"{len(labels)} label column(s) {labels}: give one of each per label")
    for i, fn in enumerate(fns):
        if not callable(fn):
            raise ConfigError(f"to_lightning_module: loss_fns[{i}] is not callable: {fn!r}")
    return _module_class(package)(model, optimizer, fns, weights, feature_cols, labels, sample_weights_col)


__all__ = ["to_lightning_module"]
