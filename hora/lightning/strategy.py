"""``hora.lightning.Strategy``: Lightning trains data-parallel over hora.

What Lightning's removed ``HorovodStrategy`` did, for Lightning 2.6 and both import names::

    import lightning as L                      # or: import pytorch_lightning as pl
    import hora.lightning
    trainer = L.Trainer(strategy=hora.lightning.Strategy(), max_epochs=10)
    trainer.fit(model, train_loader)           # hora run -np 4 python train.py

Per rank: ``hora.init()`` (rank, size and devices come from hora's launcher), rank 0's
weights and optimizer state broadcast to every rank, each optimizer wrapped in
:func:`hora.torch.DistributedOptimizer` (gradients averaged while backward runs, named by
the module's parameter names, ``backward_passes_per_step`` = ``accumulate_grad_batches``),
learning rates scaled by the number of ranks as Horovod did (``scale_lr=False`` keeps
them), Lightning's ``DistributedSampler`` fed hora's rank and size, ``self.log(...,
sync_dist=True)`` and Lightning's own ``reduce`` / ``all_gather`` / ``broadcast`` /
``barrier`` through hora's collectives, checkpoints written by rank 0 only. ``teardown``
removes the optimizer hooks and leaves hora initialized.

With automatic optimization the reduced gradients are in ``.grad`` right after the
backward pass of every step (before gradient clipping and ``on_before_optimizer_step``);
the backward passes of an accumulation window that do not step are not reduced. With
manual optimization ``optimizer.step()`` waits for the reduction itself.

``Strategy`` is one name for two classes: ``Strategy()`` returns an instance of the
class built on the Lightning in use (see :func:`hora.lightning._compat.resolve_flavor`;
``package=`` chooses explicitly). Both are subclasses of ``hora.lightning.Strategy`` and
of that Lightning's ``ParallelStrategy``.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from functools import wraps
from typing import Any, ClassVar

import torch

import hora.native as hn
from hora.errors import ConfigError
from hora.lightning import collectives
from hora.lightning._compat import Flavor, get_flavor, resolve_flavor
from hora.native.rendezvous import ENV_RENDEZVOUS_ADDR

log = logging.getLogger(__name__)

#: DistributedOptimizer arguments the strategy sets itself
_OWNED_OPTIMIZER_ARGS = ("named_parameters", "backward_passes_per_step")


class Strategy:
    """A Lightning strategy that trains data-parallel through hora (Horovod's strategy, renamed).

    Args:
        accelerator, parallel_devices, checkpoint_io, precision_plugin: as for any
            Lightning ``ParallelStrategy`` (the Trainer fills them in). Each rank uses one
            device: the CPU, or the GPU of its local rank.
        scale_lr: multiply every learning rate (and LR schedulers' base rates) by the
            number of ranks, as Horovod's strategy and estimators do (default True).
        distributed_optimizer_kwargs: further arguments of
            :func:`hora.torch.DistributedOptimizer` (``compression``, ``op``,
            ``gradient_predivide_factor``, ``bucket_cap_mb``...).
        package: ``"lightning"`` or ``"pytorch_lightning"``: which Trainer this is for
            (default: inferred, see the module docstring).

    Raises:
        ConfigError: a bad argument, no Lightning installed, or both import names in use
            and no ``package``.
        RendezvousError: hora's peers never arrived (from ``hora.init()``).
    """

    strategy_name = "hora"
    _flavor: ClassVar[Flavor | None] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls._flavor is None:  # the generic name: build on the Lightning in use
            hints = [kwargs.get(k) for k in ("accelerator", "checkpoint_io", "precision_plugin")] + list(args)
            cls = strategy_class(resolve_flavor(kwargs.get("package"), hints).name)
        return super(Strategy, cls).__new__(cls)

    def __init__(
        self,
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        checkpoint_io: Any = None,
        precision_plugin: Any = None,
        *,
        scale_lr: bool = True,
        distributed_optimizer_kwargs: Mapping[str, Any] | None = None,
        package: str | None = None,
    ) -> None:
        flavor = self._flavor
        assert flavor is not None  # __new__ picked a concrete class
        if package is not None and package != flavor.name:
            raise ConfigError(f"package={package!r} was given to the strategy built for {flavor.name}")
        if not isinstance(scale_lr, bool):
            raise ConfigError(f"scale_lr must be True or False, got {scale_lr!r}")
        opt_kwargs = dict(distributed_optimizer_kwargs or {})
        owned = sorted(set(opt_kwargs) & set(_OWNED_OPTIMIZER_ARGS))
        if owned:
            raise ConfigError(
                f"distributed_optimizer_kwargs must not set {', '.join(owned)}: the strategy takes the names from the "
                "LightningModule and the passes per step from Trainer(accumulate_grad_batches=)"
            )
        hn.init()
        super().__init__(  # type: ignore[call-arg]
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=environment_class(flavor.name)(),
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self._scale_lr = scale_lr
        self._opt_kwargs = opt_kwargs
        self._exit_stack: ExitStack | None = None
        self._sync_in_backward = False  # automatic optimization: reduce right after backward
        self._blocked = False  # inside Lightning's block_backward_sync (an accumulating pass)
        self._failed = False
        self._synced_bn = False
        _set_rank_zero(flavor, self.global_rank)

    # ---------------------------------------------------------------- who and where
    @property
    def global_rank(self) -> int:
        return hn.rank()

    @property
    def local_rank(self) -> int:
        return hn.local_rank()

    @property
    def node_rank(self) -> int:
        return hn.cross_rank()

    @property
    def world_size(self) -> int:
        return hn.size()

    @property
    def is_distributed(self) -> bool:
        """Lightning reads this to add a DistributedSampler and to honour ``sync_dist``."""
        return hn.size() > 1

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": hn.size(), "rank": hn.rank()}

    @property
    def root_device(self) -> torch.device:
        """The CPU, or on a GPU accelerator the GPU of this rank's local rank (one per rank).

        Raises:
            ConfigError: more ranks on this host than visible GPUs (and more than one GPU).
        """
        devices = self.parallel_devices  # type: ignore[attr-defined]
        if not devices or devices[0].type == "cpu":
            return torch.device("cpu")
        kind = devices[0].type
        if kind != "cuda":
            return devices[min(self.local_rank, len(devices) - 1)]
        count = torch.cuda.device_count()
        local = self.local_rank
        if count > local:
            return torch.device("cuda", local)
        if count == 1:  # one GPU made visible to each process (Spark/Dask GPU scheduling)
            return torch.device("cuda", 0)
        raise ConfigError(
            f"local rank {local} has no GPU of its own: {count} GPUs are visible on this host; start at most "
            f"{count} ranks per host or make one GPU visible to each (CUDA_VISIBLE_DEVICES)"
        )

    # ---------------------------------------------------------------- set-up
    def setup_environment(self) -> None:
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        super().setup_environment()  # type: ignore[misc]
        self._flavor.fabric_sub("utilities.seed").reset_seed()  # type: ignore[union-attr]
        _set_rank_zero(self._flavor, self.global_rank)

    def model_to_device(self) -> None:
        assert self.model is not None  # type: ignore[attr-defined]
        self.model.to(self.root_device)  # type: ignore[attr-defined]

    def setup(self, trainer: Any) -> None:
        """Lightning's set-up (optimizers through :meth:`setup_optimizers`), then rank 0's
        parameters and buffers on every rank, in every stage. With
        ``Trainer(sync_batchnorm=True)`` the module's BatchNorm layers become
        :class:`hora.torch.SyncBatchNorm` while fitting."""
        if self._layer_sync is not None and trainer.state.fn == "fit":  # type: ignore[attr-defined]
            from hora.torch import SyncBatchNorm

            self.model = SyncBatchNorm.convert_sync_batchnorm(self.model)  # type: ignore[attr-defined]
            self._synced_bn = True
        super().setup(trainer)  # type: ignore[misc]
        from hora.torch import broadcast_parameters

        broadcast_parameters(self.lightning_module.state_dict(), root_rank=0)  # type: ignore[attr-defined]

    def setup_optimizers(self, trainer: Any) -> None:
        """``configure_optimizers``, then per optimizer: learning rates scaled, rank 0's state
        broadcast, the optimizer wrapped in hora's DistributedOptimizer (schedulers follow)."""
        super().setup_optimizers(trainer)  # type: ignore[misc]
        from hora.torch import DistributedOptimizer, broadcast_optimizer_state, is_distributed_optimizer

        module = self.lightning_module  # type: ignore[attr-defined]
        automatic = bool(module.automatic_optimization)
        passes = _accumulation(trainer) if automatic else 1
        wrapped = []
        for opt in self.optimizers:
            raw = getattr(opt, "_optimizer", opt)  # a LightningOptimizer returned by configure_optimizers
            if is_distributed_optimizer(raw):
                log.info("configure_optimizers returned a hora DistributedOptimizer; the strategy uses it as it is")
                wrapped.append(raw)
                continue
            if self._scale_lr:
                self._scale_learning_rates(raw)
            broadcast_optimizer_state(raw, root_rank=0)
            dist = DistributedOptimizer(
                raw, named_parameters=_named_parameters(module, raw), backward_passes_per_step=passes,
                **self._opt_kwargs,
            )
            self._follow_schedulers(raw, dist)
            wrapped.append(dist)
        self.optimizers = wrapped
        self._close_exit_stack()
        self._sync_in_backward = automatic
        if automatic:  # the strategy synchronizes after backward; step() must not do it again
            self._exit_stack = ExitStack()
            for opt in wrapped:
                self._exit_stack.enter_context(opt.skip_synchronize())

    def _scale_learning_rates(self, raw: torch.optim.Optimizer) -> None:
        size = hn.size()
        if size > 1:
            self._flavor.sub("utilities.rank_zero").rank_zero_info(  # type: ignore[union-attr]
                f"hora.lightning.Strategy: learning rates x {size} (the number of ranks, as Horovod); "
                "Strategy(scale_lr=False) keeps them")
        for group in raw.param_groups:
            group["lr"] = group["lr"] * size
            if "initial_lr" in group:
                group["initial_lr"] = group["initial_lr"] * size
        for config in self.lr_scheduler_configs:  # type: ignore[attr-defined]
            sched = config.scheduler
            if getattr(sched, "optimizer", None) is raw and hasattr(sched, "base_lrs"):
                sched.base_lrs = [lr * size for lr in sched.base_lrs]
                if hasattr(sched, "_last_lr"):
                    sched._last_lr = [g["lr"] for g in raw.param_groups]

    def _follow_schedulers(self, raw: torch.optim.Optimizer, dist: torch.optim.Optimizer) -> None:
        """Point the LR schedulers of ``raw`` at its wrapper ``dist``.

        A torch scheduler keeps its optimizer and replaces that optimizer's ``step`` by a
        counting wrapper bound to it; the DistributedOptimizer copied that wrapper with the
        rest of ``raw.__dict__``, so ``dist.step`` would step ``raw`` and skip hora. After a
        resume ``load_state_dict`` gives ``dist`` new param groups, which a scheduler still
        holding ``raw`` would never adjust.
        """
        dist.__dict__.pop("step", None)
        followed = False
        for config in self.lr_scheduler_configs:  # type: ignore[attr-defined]
            sched = config.scheduler
            if getattr(sched, "optimizer", None) is raw:
                sched.optimizer = dist
                followed = True
        if followed:
            _count_steps(dist)

    # ---------------------------------------------------------------- optimizers as Lightning sees them
    @property
    def optimizers(self) -> list[Any]:
        return self._optimizers  # type: ignore[attr-defined]

    @optimizers.setter
    def optimizers(self, optimizers: list[Any]) -> None:
        from hora.torch import is_distributed_optimizer

        self._optimizers = optimizers
        lightning_optimizer = self._flavor.sub("core.optimizer").LightningOptimizer  # type: ignore[union-attr]
        self._lightning_optimizers = []
        for opt in optimizers:
            lo = lightning_optimizer._to_lightning_optimizer(opt, self)
            if is_distributed_optimizer(opt):
                # the wrapper's class derives from the optimizer's: without these its own
                # zero_grad()/synchronize() would run hora's methods on the wrapper's __dict__
                for name in ("zero_grad", "synchronize", "skip_synchronize", "remove_hooks"):
                    setattr(lo, name, getattr(opt, name))
            self._lightning_optimizers.append(lo)

    # ---------------------------------------------------------------- backward
    @contextmanager
    def block_backward_sync(self) -> Iterator[None]:
        """Lightning's accumulating passes: their gradients stay local."""
        self._blocked = True
        try:
            yield None
        finally:
            self._blocked = False

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        super().post_backward(closure_loss)  # type: ignore[misc]
        if self._sync_in_backward and not self._blocked:
            for opt in self.optimizers:
                synchronize = getattr(opt, "synchronize", None)
                if synchronize is not None:
                    synchronize()

    # ---------------------------------------------------------------- collectives
    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        return collectives.reduce(tensor, group=group, reduce_op=reduce_op)

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        return collectives.all_gather(tensor, group=group, sync_grads=sync_grads)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return collectives.broadcast(obj, src)

    def barrier(self, name: str | None = None, *args: Any, **kwargs: Any) -> None:
        collectives.barrier()

    # ---------------------------------------------------------------- the end
    def on_exception(self, exception: BaseException) -> None:
        self._failed = True  # peers may be gone: teardown must not wait for them
        super().on_exception(exception)  # type: ignore[misc]

    def teardown(self) -> None:
        """Remove the optimizers' gradient hooks, wait for every rank (unless training
        failed), then Lightning's teardown. hora stays initialized."""
        from hora.torch import is_distributed_optimizer

        self._close_exit_stack()
        self._sync_in_backward = False
        for opt in self.optimizers:
            if is_distributed_optimizer(opt):
                opt.remove_hooks()
        if not self._failed and hn.is_initialized():
            collectives.barrier()
        self._failed = False
        if self._synced_bn and self.lightning_module is not None:  # type: ignore[attr-defined]
            _revert_sync_batchnorm(self.lightning_module, self._flavor)  # type: ignore[attr-defined,arg-type]
            self._synced_bn = False
        super().teardown()  # type: ignore[misc]

    def _close_exit_stack(self) -> None:
        if self._exit_stack is not None:
            self._exit_stack.close()
            self._exit_stack = None

    def __repr__(self) -> str:
        return f"hora.lightning.Strategy(rank {hn.rank()} of {hn.size()}, {self._flavor.name if self._flavor else '?'})"


# ---------------------------------------------------------------------------- helpers
def _set_rank_zero(flavor: Flavor, rank: int) -> None:
    """Lightning prints, logs and saves on rank 0 through ``rank_zero_only.rank``."""
    from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only

    flavor.sub("utilities.rank_zero").rank_zero_only.rank = rank
    flavor.fabric_sub("utilities.rank_zero").rank_zero_only.rank = rank
    utils_rank_zero_only.rank = rank


def _accumulation(trainer: Any) -> int:
    """Backward passes per optimizer step: ``accumulate_grad_batches``, or the largest of a
    ``GradientAccumulationScheduler``'s schedule."""
    passes = int(trainer.accumulate_grad_batches)
    for cb in getattr(trainer, "callbacks", []):
        scheduling = getattr(cb, "scheduling", None)
        if type(cb).__name__ == "GradientAccumulationScheduler" and isinstance(scheduling, Mapping):
            passes = max([passes, *(int(v) for v in scheduling.values())])
    return passes


def _named_parameters(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
    """The module's ``(name, parameter)`` pairs for the parameters ``optimizer`` updates."""
    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return [(name, p) for name, p in module.named_parameters() if id(p) in ids]


def _revert_sync_batchnorm(module: torch.nn.Module, flavor: Flavor) -> None:
    """Turn the hora SyncBatchNorm layers of ``module`` back into plain batch norms, in place
    (Lightning's ``_BatchNormXd``, as Lightning's own layer sync does)."""
    from hora.torch import SyncBatchNorm

    plain = flavor.sub("plugins.layer_sync")._BatchNormXd
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, SyncBatchNorm):
                bn = plain(child.num_features, child.eps, child.momentum, child.affine, child.track_running_stats)
                if child.affine:
                    bn.weight, bn.bias = child.weight, child.bias
                bn.running_mean, bn.running_var = child.running_mean, child.running_var
                bn.num_batches_tracked = child.num_batches_tracked
                bn.train(child.training)
                parent.add_module(name, bn)


def _count_steps(dist: torch.optim.Optimizer) -> None:
    """Mark ``dist.step`` the way a torch LR scheduler marks its optimizer's step, so the
    scheduler can tell that the optimizer stepped (else it warns about the order)."""
    ref = weakref.ref(dist)
    step = type(dist).step

    @wraps(step)
    def counted(*args: Any, **kwargs: Any) -> Any:
        opt = ref()
        opt._opt_called = True  # type: ignore[union-attr]
        return step(opt, *args, **kwargs)

    counted._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    dist.step = counted  # type: ignore[method-assign]


class _Environment:
    """Lightning's ClusterEnvironment answered by hora: the launcher started the processes."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        addr = os.environ.get(ENV_RENDEZVOUS_ADDR, "")
        return addr.rsplit(":", 1)[0] if ":" in addr else "127.0.0.1"

    @property
    def main_port(self) -> int:
        addr = os.environ.get(ENV_RENDEZVOUS_ADDR, "")
        tail = addr.rsplit(":", 1)[-1] if ":" in addr else ""
        return int(tail) if tail.isdigit() else 0

    @staticmethod
    def detect() -> bool:
        return hn.is_initialized()

    def world_size(self) -> int:
        return hn.size()

    def set_world_size(self, size: int) -> None:
        if size != hn.size():
            log.debug("Lightning proposed world size %d; hora's job has %d ranks", size, hn.size())

    def global_rank(self) -> int:
        return hn.rank()

    def set_global_rank(self, rank: int) -> None:
        if rank != hn.rank():
            log.debug("Lightning proposed global rank %d; hora's rank is %d", rank, hn.rank())

    def local_rank(self) -> int:
        return hn.local_rank()

    def node_rank(self) -> int:
        return hn.cross_rank()

    def teardown(self) -> None:
        pass


_CLASSES: dict[str, type] = {}


def strategy_class(package: str) -> type:
    """The concrete strategy class for ``package`` (``"lightning"`` or ``"pytorch_lightning"``),
    built once: ``hora.lightning.Strategy`` + that package's ``ParallelStrategy``.

    Raises:
        ConfigError: the package is unknown or not installed.
    """
    key = f"Strategy_{package}"
    if key not in _CLASSES:
        flavor = get_flavor(package)
        base = flavor.sub("strategies").ParallelStrategy
        _CLASSES[key] = type("Strategy", (Strategy, base), {
            "_flavor": flavor, "__module__": __name__, "__qualname__": key, "__doc__": Strategy.__doc__,
        })
    return _CLASSES[key]


def environment_class(package: str) -> type:
    """hora's ClusterEnvironment class for ``package``, built once."""
    key = f"Environment_{package}"
    if key not in _CLASSES:
        base = get_flavor(package).fabric_sub("plugins").ClusterEnvironment
        _CLASSES[key] = type("HoraEnvironment", (_Environment, base), {"__module__": __name__, "__qualname__": key})
    return _CLASSES[key]


def __getattr__(name: str) -> Any:
    """``Strategy_lightning`` etc. by name, so that pickle finds the built classes."""
    for prefix, build in (("Strategy_", strategy_class), ("Environment_", environment_class)):
        if name.startswith(prefix):
            return build(name[len(prefix):])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


HoraStrategy = Strategy

__all__ = ["HoraStrategy", "Strategy", "environment_class", "strategy_class"]
