"""``DistributedOptimizer`` for Keras 3 (TensorFlow backend).

A Keras 3 optimizer applies gradients in ``apply`` (``apply_gradients`` calls it, and
so does ``model.fit``'s train step). Just before the update (and before gradient
clipping, as Horovod does) it calls ``_clip_gradients(grads)`` exactly once per update
step, also when gradients are accumulated over several backward passes. The distributed
optimizer is a subclass of the user's optimizer class whose ``_clip_gradients``
allreduces the gradients first, so it stays a Keras 3 optimizer that
``model.compile(optimizer=...)``, ``model.fit`` and ``model.save`` accept.

``backward_passes_per_step=N`` uses Keras' own ``gradient_accumulation_steps=N``:
gradients are accumulated locally and allreduced once every N passes.
"""

from __future__ import annotations

import logging
from typing import Any

import hora.native as hn
from hora.errors import ConfigError

log = logging.getLogger(__name__)

_LEGACY_PREFIXES = ("tf_keras", "tensorflow.python.keras", "keras.optimizers.legacy", "keras.src.optimizers.legacy",
                    "keras.optimizers.optimizer_v2", "keras.src.optimizers.optimizer_v2")


def _keras():
    import keras

    return keras


def check_keras3_optimizer(optimizer: Any, where: str = "hora.keras.DistributedOptimizer") -> None:
    """Raise a clear :class:`ConfigError` unless ``optimizer`` is a Keras 3 optimizer instance.

    Raises:
        ConfigError: a class instead of an instance; a Keras 2 / ``tf_keras`` /
            ``tf.compat.v1`` optimizer; anything else that is not a
            ``keras.optimizers.Optimizer``.
    """
    keras = _keras()
    if isinstance(optimizer, type):
        raise ConfigError(f"{where}: pass an optimizer instance, e.g. {optimizer.__name__}(learning_rate=...), "
                          "not the class")
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return
    cls = type(optimizer)
    mod = cls.__module__ or ""
    if mod.startswith(_LEGACY_PREFIXES):
        raise ConfigError(
            f"{where}: {mod}.{cls.__name__} is a Keras 2 (tf_keras) optimizer, but hora.keras needs a Keras 3 "
            f"optimizer (keras {keras.__version__} is installed): use keras.optimizers.{cls.__name__}(...) and build "
            "the model with `import keras` (do not set TF_USE_LEGACY_KERAS=1)"
        )
    if mod.startswith("tensorflow") and "train" in mod:
        raise ConfigError(
            f"{where}: {mod}.{cls.__name__} is a TensorFlow 1 (tf.compat.v1.train) optimizer; hora supports "
            "Keras 3 optimizers (keras.optimizers.*), or a tf.GradientTape with hora.tensorflow.DistributedGradientTape"
        )
    raise ConfigError(f"{where}: expected a keras.optimizers.Optimizer instance, got {mod}.{cls.__name__}")


class _CallableList(list):
    """A list that can also be called: ``opt.variables`` and Keras 2's ``opt.variables()`` (Horovod's shim)."""

    def __call__(self) -> list:
        return self


class _DistributedOptimizerMixin:
    """Grafted in front of the user's optimizer class: allreduce, then clip and update."""

    _hora_distributed = True

    @property
    def variables(self):
        """The optimizer's variables; callable too, as Keras 2 programs (Horovod's examples) call it."""
        return _CallableList(super().variables)

    @property
    def lr(self):
        """Keras 2's name of the learning-rate variable (``keras.backend.set_value(opt.lr, v)``): the
        ``tf.Variable`` behind it (a schedule is returned as is)."""
        lr = self._learning_rate
        return lr.value if hasattr(lr, "value") and hasattr(lr, "assign") else lr

    @lr.setter
    def lr(self, value) -> None:
        self.learning_rate = value

    def register_local_var(self, var: Any) -> None:
        """Keep ``var``'s gradient local (not reduced; divided by the set's size with
        ``scale_local_gradients``), as Horovod's ``register_local_var``."""
        from hora.tensorflow._reduce import source_key

        self._hora_local[source_key(var)] = var

    def _backend_apply_gradients(self, grads, trainable_variables):
        # what _clip_gradients' gradients belong to (object.__setattr__: not a tracked dependency)
        object.__setattr__(self, "_hora_vars", list(trainable_variables))
        return super()._backend_apply_gradients(grads, trainable_variables)

    def _clip_gradients(self, grads):
        grads = self._hora_reduce(list(grads))
        return super()._clip_gradients(grads)

    def _hora_reduce(self, grads: list) -> list:
        from hora.tensorflow._reduce import included, reduce_except_local

        steps = self.gradient_accumulation_steps or 1
        if steps > 1 and not self._hora_average_aggregated:
            # Keras averages accumulated gradients; Horovod's default sums them.
            grads = [None if g is None else g * steps for g in grads]
        ps = self._hora_process_set
        if not included(ps) or (hn.size() == 1 and ps is hn.global_process_set):
            return grads
        variables = getattr(self, "_hora_vars", None)
        if variables is None or len(variables) != len(grads):
            variables = list(self._trainable_variables)
        return reduce_except_local(
            grads, variables, set(self._hora_local), self._hora_scale_local, ps, op=self._hora_op,
            compression=self._hora_compression, sparse_as_dense=self._hora_sparse_as_dense,
            gradient_predivide_factor=self._hora_predivide, groups=self._hora_groups, name=self._hora_name,
        )


def is_distributed_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` was made by :func:`DistributedOptimizer`."""
    return bool(getattr(optimizer, "_hora_distributed", False))


def _distributed_class(base: type) -> type:
    if not hasattr(base, "_clip_gradients"):
        raise NotImplementedError(
            "hora.keras.DistributedOptimizer hooks the Keras 3 optimizer method _clip_gradients, which "
            f"{base.__module__}.{base.__name__} lacks (this Keras version is not supported)"
        )
    # Same name and module as the user's class: a model saved with it loads back with the plain optimizer.
    return type(base.__name__, (_DistributedOptimizerMixin, base),
                {"__module__": base.__module__, "__qualname__": base.__qualname__})


def _attach(opt, *, name, compression, sparse_as_dense, average_aggregated_gradients, op,
            gradient_predivide_factor, process_set, groups=None, scale_local_gradients=True) -> None:
    opt._hora_name = name
    opt._hora_compression = compression
    opt._hora_sparse_as_dense = bool(sparse_as_dense)
    opt._hora_average_aggregated = bool(average_aggregated_gradients)
    opt._hora_op = hn.Average if op is None else op
    opt._hora_predivide = float(gradient_predivide_factor)
    opt._hora_process_set = hn.global_process_set if process_set is None else process_set
    opt._hora_groups = groups
    opt._hora_scale_local = bool(scale_local_gradients)
    object.__setattr__(opt, "_hora_local", {})  # not a tracked dependency of the optimizer


def DistributedOptimizer(
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = None,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = None,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = None,
    scale_local_gradients: bool = True,
) -> Any:
    """Return a Keras 3 optimizer that averages gradients across ranks before every update.

    The result is a new instance of a subclass of ``type(optimizer)`` built from
    ``optimizer.get_config()`` (state of an already built ``optimizer`` is not carried
    over, as in Horovod). Gradients are allreduced before clipping; ``IndexedSlices``
    gradients are allgathered unless ``sparse_as_dense``. With
    ``backward_passes_per_step=N`` the gradients of N ``apply`` calls are accumulated
    locally (Keras' ``gradient_accumulation_steps``) and allreduced once; the accumulated
    gradient is their sum, or their mean with ``average_aggregated_gradients=True``.
    ``name`` prefixes the allreduce names. ``groups``/``num_groups`` choose which
    gradients are fused (see :mod:`hora.tensorflow.gradients`); ``register_local_var``
    keeps a variable's gradient local. ``device_dense``/``device_sparse`` are accepted
    for Horovod compatibility (the engine picks the device). The arguments are Horovod's,
    in its order. Inside ``model.fit`` on a GPU, compile with ``jit_compile=False``: XLA
    cannot compile the collective's ``py_function``.

    Raises:
        ConfigError: ``optimizer`` is not a Keras 3 optimizer (a Keras 2 / ``tf_keras``
            one gets a message saying so), is already distributed, or the arguments are
            invalid (``backward_passes_per_step`` < 1, or > 1 while the optimizer already
            sets ``gradient_accumulation_steps``; ``gradient_predivide_factor`` with an op
            other than Average; an op other than Average/Sum, as Horovod's Keras).
        ValueError: bad ``groups`` (Horovod's message).
    """
    from hora.tensorflow._reduce import check_groups

    check_keras3_optimizer(optimizer)
    groups = check_groups(groups, num_groups)
    if is_distributed_optimizer(optimizer):
        raise ConfigError("hora.keras.DistributedOptimizer: this optimizer is already distributed")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ConfigError(f"backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}")
    op_ = hn.Average if op is None else op
    if op_ not in (hn.Average, hn.Sum):
        raise ConfigError(f"hora.keras.DistributedOptimizer: op={op_!r}; the Keras optimizer reduces gradients with "
                          "Average or Sum only (as Horovod's)")
    if gradient_predivide_factor != 1.0 and op_ != hn.Average:
        raise ConfigError("gradient_predivide_factor needs op=Average")
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        if config.get("gradient_accumulation_steps"):
            raise ConfigError(
                f"backward_passes_per_step={backward_passes_per_step} conflicts with the optimizer's own "
                f"gradient_accumulation_steps={config['gradient_accumulation_steps']}; set only one"
            )
        config["gradient_accumulation_steps"] = backward_passes_per_step
    cls = _distributed_class(type(optimizer))
    opt = cls.from_config(config)
    _attach(opt, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
            average_aggregated_gradients=average_aggregated_gradients, op=op_,
            gradient_predivide_factor=gradient_predivide_factor, process_set=process_set, groups=groups,
            scale_local_gradients=scale_local_gradients)
    return opt


def make_distributed_in_place(optimizer: Any, **kwargs: Any) -> Any:
    """Turn an existing Keras 3 optimizer (e.g. one just loaded with its state) distributed.

    Unlike :func:`DistributedOptimizer` this keeps the instance and its variables; it
    changes the instance's class. ``kwargs`` as :func:`DistributedOptimizer` except
    ``backward_passes_per_step`` (the optimizer's own ``gradient_accumulation_steps``
    applies).

    Raises:
        ConfigError: as :func:`DistributedOptimizer`.
    """
    check_keras3_optimizer(optimizer, "hora.keras.load_model")
    if is_distributed_optimizer(optimizer):
        return optimizer
    if kwargs.pop("backward_passes_per_step", 1) != 1:
        raise ConfigError("make_distributed_in_place: set gradient_accumulation_steps on the optimizer instead of "
                          "backward_passes_per_step")
    for ignored in ("device_dense", "device_sparse"):
        kwargs.pop(ignored, None)
    defaults = dict(name=None, compression=None, sparse_as_dense=False, average_aggregated_gradients=False,
                    op=None, gradient_predivide_factor=1.0, process_set=None, groups=None, scale_local_gradients=True)
    unknown = set(kwargs) - set(defaults)
    if unknown:
        raise ConfigError(f"make_distributed_in_place: unknown argument(s) {sorted(unknown)}")
    defaults.update(kwargs)
    optimizer.__class__ = _distributed_class(type(optimizer))
    _attach(optimizer, **defaults)
    return optimizer


__all__ = ["DistributedOptimizer", "is_distributed_optimizer", "check_keras3_optimizer", "make_distributed_in_place"]
