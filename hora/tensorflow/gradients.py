"""Averaging gradients across ranks: ``DistributedGradientTape``, ``PartialDistributedGradientTape``,
and ``DistributedOptimizer`` for Keras 3 and ``tf.compat.v1.train`` optimizers.

Gradients are reduced as Horovod reduces them: dense ones by allreduce (``op``,
``Average`` by default; ``gradient_predivide_factor`` splits the average into a
``1/f`` prescale and an ``f/size`` postscale), ``tf.IndexedSlices`` by allgather of
values and indices (or densified with ``sparse_as_dense=True``). ``groups`` (an int,
or lists of variables) chooses which gradients are fused together; the default fuses
all dense gradients of a call. Gradients of sources registered as *local*
(``register_local_source``, ``PartialDistributedGradientTape(local_layers=...)``) are
not reduced; with ``scale_local_gradients`` (the default) they are divided by the
set's size, as Horovod does. A rank outside ``process_set`` keeps its local gradients.
"""

from __future__ import annotations

import logging
from typing import Any

import hora.native as hn
from hora.errors import ConfigError
from hora.tensorflow import bridge, collectives
from hora.tensorflow._reduce import check_groups, included, reduce_except_local, reduce_gradients, source_key

log = logging.getLogger(__name__)


class _DistributedGradientTapeMixin:
    """Methods grafted onto a copy of the user's tape (see :func:`DistributedGradientTape`)."""

    def register_local_source(self, source: Any) -> None:
        """Keep ``source``'s gradient local (not reduced; scaled by 1/size with ``scale_local_gradients``)."""
        self._hora_local[source_key(source)] = source

    def gradient(self, target, sources, output_gradients=None, use_generic_names: bool = False, **kwargs):
        tf = bridge.tf_module()
        grads = super().gradient(target, sources, output_gradients, **kwargs)
        flat_sources, flat_grads = tf.nest.flatten(sources), tf.nest.flatten(grads)
        reduced = reduce_except_local(flat_grads, flat_sources, set(self._hora_local), self._hora_scale_local,
                                      self._hora_process_set, use_generic_names=use_generic_names,
                                      **self._hora_reduce)
        return tf.nest.pack_sequence_as(grads, reduced)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names: bool = False):
        """``(local, global)``: lists of ``(source, gradient)`` pairs, local sources first."""
        grads = self.gradient(target, sources, output_gradients, use_generic_names=use_generic_names)
        local, global_ = [], []
        for s, g in zip(sources, grads):
            (local if source_key(s) in self._hora_local else global_).append((s, g))
        return local, global_


def DistributedGradientTape(gradtape, device_dense: str = "", device_sparse: str = "", compression: Any = None,
                            sparse_as_dense: bool = False, op: Any = None, gradient_predivide_factor: float = 1.0,
                            num_groups: int = 0, groups: Any = None, process_set: Any = None,
                            scale_local_gradients: bool = True):
    """Wrap a ``tf.GradientTape`` so ``gradient()`` returns gradients averaged across ranks.

    Returns a tape of a subclass of ``type(gradtape)`` that shares the recorded state of
    ``gradtape``; it can wrap a tape after its ``with`` block (Horovod's usage) or before.
    ``device_dense``/``device_sparse`` are accepted for Horovod compatibility (the
    engine picks the device). Every rank must agree on which gradients are ``None``.

    Raises:
        ConfigError: ``gradtape`` is not a ``tf.GradientTape`` or is already distributed.
        ValueError: ``gradient_predivide_factor`` with an op other than Average; bad ``groups``.
    """
    tf = bridge.tf_module()
    if not isinstance(gradtape, tf.GradientTape):
        raise ConfigError(f"DistributedGradientTape wraps a tf.GradientTape, got {type(gradtape).__name__}")
    if isinstance(gradtape, _DistributedGradientTapeMixin):
        raise ConfigError("DistributedGradientTape: this tape is already distributed")
    op = hn.Average if op is None else op
    if gradient_predivide_factor != 1.0 and op != hn.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    groups = check_groups(groups, num_groups)
    base = type(gradtape)
    cls = type(base.__name__, (_DistributedGradientTapeMixin, base), {"__module__": __name__})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._hora_reduce = dict(op=op, compression=compression, sparse_as_dense=bool(sparse_as_dense),
                             gradient_predivide_factor=float(gradient_predivide_factor), groups=groups)
    tape._hora_process_set = process_set
    tape._hora_scale_local = bool(scale_local_gradients)
    tape._hora_local = {}
    return tape


def PartialDistributedGradientTape(gradtape, device_dense: str = "", device_sparse: str = "",
                                   compression: Any = None, sparse_as_dense: bool = False, op: Any = None,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups: Any = None,
                                   process_set: Any = None, local_layers: Any = None,
                                   scale_local_gradients: bool = True):
    """A :func:`DistributedGradientTape` whose ``local_layers``' trainable weights keep local gradients.

    Raises:
        ValueError: an element of ``local_layers`` is not a Keras layer. Otherwise as
            :func:`DistributedGradientTape`.
    """
    if local_layers is None:
        local_layers = []
    else:
        import keras

        if isinstance(local_layers, keras.layers.Layer):
            local_layers = [local_layers]
        elif not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
            raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape


def _legacy_optimizer_base():
    tf = bridge.tf_module()
    return getattr(getattr(getattr(tf, "compat", None), "v1", None), "train", None) and tf.compat.v1.train.Optimizer


def _legacy_distributed(optimizer, name, use_locking, reduce_kwargs, process_set, scale_local_gradients):
    """A ``tf.compat.v1.train.Optimizer`` that reduces gradients in ``compute_gradients`` (TF1 graphs)."""
    base = _legacy_optimizer_base()

    class _DistributedOptimizer(base):
        def __init__(self) -> None:
            super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)
            self._optimizer = optimizer
            self._local = {}

        def register_local_var(self, var: Any) -> None:
            """Keep ``var``'s gradient local (not reduced)."""
            self._local[source_key(var)] = var

        def compute_gradients(self, *args: Any, **kwargs: Any) -> list:
            grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
            grads, variables = zip(*grads_and_vars)
            reduced = reduce_except_local(grads, variables, set(self._local), scale_local_gradients, process_set,
                                          **reduce_kwargs)
            return list(zip(reduced, variables))

        def apply_gradients(self, *args: Any, **kwargs: Any) -> Any:
            return self._optimizer.apply_gradients(*args, **kwargs)

        def get_slot(self, *args: Any, **kwargs: Any) -> Any:
            return self._optimizer.get_slot(*args, **kwargs)

        def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
            return self._optimizer.get_slot_names(*args, **kwargs)

        def variables(self, *args: Any, **kwargs: Any) -> Any:
            return self._optimizer.variables(*args, **kwargs)

    return _DistributedOptimizer()


def DistributedOptimizer(optimizer, name: str | None = None, use_locking: bool = False, device_dense: str = "",
                         device_sparse: str = "", compression: Any = None, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op: Any = None, gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0, groups: Any = None,
                         process_set: Any = None, scale_local_gradients: bool = True):
    """Horovod's ``hvd.DistributedOptimizer`` for TensorFlow.

    A Keras 3 optimizer is wrapped by :func:`hora.keras.DistributedOptimizer` (the
    arguments are passed on). A ``tf.compat.v1.train.Optimizer`` (TF1 graphs and
    sessions) becomes one whose ``compute_gradients`` reduces the gradients.

    Raises:
        ValueError: as Horovod (``gradient_predivide_factor`` with op != Average, Adasum
            with Keras or with ``average_aggregated_gradients``, bad ``groups``).
        NotImplementedError: ``backward_passes_per_step > 1`` or Adasum with a
            ``tf.compat.v1`` optimizer.
        ConfigError: anything else (a Keras 2 / ``tf_keras`` optimizer gets a message saying so).
    """
    op = hn.Average if op is None else op
    if gradient_predivide_factor != 1.0 and op != hn.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if collectives._is_adasum(op) and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients == True")
    groups = check_groups(groups, num_groups)
    legacy = _legacy_optimizer_base()
    if legacy and isinstance(optimizer, legacy):
        if collectives._is_adasum(op):
            raise NotImplementedError("hora.tensorflow.DistributedOptimizer: Adasum with a tf.compat.v1 optimizer "
                                      "(Horovod's delta-model Adasum optimizer) is not implemented")
        if backward_passes_per_step != 1:
            raise NotImplementedError("hora.tensorflow.DistributedOptimizer: backward_passes_per_step > 1 with a "
                                      "tf.compat.v1 optimizer is not implemented; use a Keras 3 optimizer")
        reduce_kwargs = dict(op=op, compression=compression, sparse_as_dense=bool(sparse_as_dense),
                             gradient_predivide_factor=float(gradient_predivide_factor), groups=groups)
        return _legacy_distributed(optimizer, name, use_locking, reduce_kwargs, process_set, scale_local_gradients)
    if collectives._is_adasum(op):
        raise ValueError("op == Adasum is not supported yet with Keras")
    from hora.tensorflow.keras_optimizer import DistributedOptimizer as keras_distributed

    return keras_distributed(optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
                             compression=compression, sparse_as_dense=sparse_as_dense,
                             backward_passes_per_step=backward_passes_per_step,
                             average_aggregated_gradients=average_aggregated_gradients, op=op,
                             gradient_predivide_factor=gradient_predivide_factor, groups=groups,
                             process_set=process_set, scale_local_gradients=scale_local_gradients)


__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape", "DistributedOptimizer", "reduce_gradients",
           "reduce_except_local", "check_groups", "source_key", "included"]
