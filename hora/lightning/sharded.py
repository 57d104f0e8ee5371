"""Lightning's own sharded strategies on hora's ranks: ``ModelParallelStrategy`` and ``FSDPStrategy``.

A model larger than one rank's memory trains under Lightning's sharding, with hora's
launcher starting the ranks::

    from lightning.pytorch.strategies import ModelParallelStrategy

    class GPT(L.LightningModule):
        def configure_model(self):                 # Lightning calls it on every rank
            mesh = self.device_mesh["data_parallel"]
            for block in self.blocks:
                fully_shard(block, mesh=mesh)      # torch's FSDP2
            fully_shard(self, mesh=mesh)

    LightningEstimator(model=GPT(), trainer_args={"strategy": ModelParallelStrategy()}, ...)

or ``trainer_args={"strategy": "model_parallel"}`` (``"fsdp"`` for ``FSDPStrategy()``). On
every rank, :func:`on_hora_ranks` creates torch.distributed's default group over hora's
rendezvous (:func:`hora.torch.init_process_group`), gives the strategy hora's cluster
environment (hora's rank, size, local and cross rank) and this rank's device, and, for
``ModelParallelStrategy``, a data-parallel size of hora's size when it was left ``"auto"``
(Lightning's ``"auto"`` counts nodes, and hora's ranks each hold one device). Lightning's
checkpoints are written whole by rank 0 (``save_distributed_checkpoint=False`` /
``state_dict_type="full"``): the estimator stores one checkpoint file per epoch in its run,
and a resume or relaunch at any number of ranks loads it (Lightning reshards it as it loads).

``FSDPStrategy`` wraps the model in torch's ``FullyShardedDataParallel`` (FSDP1), which
needs an accelerator: torch refuses it on the CPU. ``ModelParallelStrategy`` (FSDP2,
``fully_shard`` and DTensor, with tensor parallelism where the module applies it) runs on
CPU ranks over Gloo as well as on GPUs.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from hora.errors import ConfigError
from hora.lightning._compat import Flavor

log = logging.getLogger(__name__)

#: names accepted as ``trainer_args["strategy"]``: name -> Lightning's class name
SHARDED_STRATEGIES = {"model_parallel": "ModelParallelStrategy", "fsdp": "FSDPStrategy"}

_FSDP1_NEEDS_GPU = ("Lightning's FSDPStrategy wraps the model in torch's FullyShardedDataParallel (FSDP1), which torch "
                    "runs only on an accelerator ('FSDP needs a non-CPU accelerator device')")


def sharded_class_name(value: Any, flavor: Flavor) -> str | None:
    """The Lightning class name of a sharded strategy given as ``trainer_args["strategy"]``
    (a name of :data:`SHARDED_STRATEGIES` or an instance of one of those classes of
    ``flavor``), or None for anything else."""
    if isinstance(value, str):
        return SHARDED_STRATEGIES.get(value)
    strategies = flavor.sub("strategies")
    for name in SHARDED_STRATEGIES.values():
        if isinstance(value, getattr(strategies, name)):
            return name
    return None


def check_sharded_strategy(value: Any, flavor: Flavor, module: Any, *, use_gpu: bool | None = None) -> str:
    """Driver-side checks of a sharded ``trainer_args["strategy"]``; returns its class name.

    Raises:
        ConfigError: not a strategy hora runs (naming the ones it does), ``FSDPStrategy``
            without a GPU, or ``ModelParallelStrategy`` with a module that has no
            ``configure_model``.
    """
    name = sharded_class_name(value, flavor)
    if name is None:
        shown = type(value).__name__ if not isinstance(value, str) else repr(value)
        raise ConfigError(
            f"trainer_args['strategy']={shown}: hora owns the strategy for data parallelism (hora.lightning.Strategy "
            "averages the gradients: leave strategy out); of Lightning's own it runs the sharded ones on its ranks: "
            f"{', '.join(repr(k) for k in SHARDED_STRATEGIES)}, or a ModelParallelStrategy / FSDPStrategy instance"
        )
    if name == "FSDPStrategy" and use_gpu is False:
        raise ConfigError(f"trainer_args['strategy'] is FSDPStrategy but the ranks train on the CPU: {_FSDP1_NEEDS_GPU}. "
                          "Pass use_gpu=True, or use ModelParallelStrategy with fully_shard in configure_model")
    if name == "ModelParallelStrategy":
        is_overridden = flavor.sub("utilities.model_helpers").is_overridden
        if not is_overridden("configure_model", module):
            raise ConfigError(
                f"trainer_args['strategy'] is ModelParallelStrategy but the LightningModule {type(module).__name__} "
                "does not define configure_model(); shard the model there (e.g. fully_shard(layer, "
                "mesh=self.device_mesh['data_parallel']) for each block, then fully_shard(self, ...))"
            )
    return name


def on_hora_ranks(value: Any, flavor: Flavor) -> Any:
    """The sharded strategy ``value`` (a name or an instance), ready to run on this hora rank.

    Call on every rank after ``hora.native.init()``. Creates torch.distributed's default
    group over hora's rendezvous; the instance's class becomes a subclass of its own that
    takes its device from hora (one device per rank) and that Lightning's CPU check lets
    through (it checks the exact class).

    Raises:
        ConfigError: as :func:`check_sharded_strategy`; ``FSDPStrategy`` on a rank with no
            GPU; a ``ModelParallelStrategy`` whose sizes do not multiply to hora's size.
    """
    import hora.native as hn
    from hora.lightning.strategy import environment_class
    from hora.torch.process_group import init_process_group

    name = sharded_class_name(value, flavor)
    if name is None:
        check_sharded_strategy(value, flavor, None)  # raises, naming what hora runs
    strategies = flavor.sub("strategies")
    strategy = getattr(strategies, name)() if isinstance(value, str) else value
    gpu = torch.cuda.is_available()
    if name == "FSDPStrategy" and not gpu:
        raise ConfigError(f"rank {hn.rank()}: {_FSDP1_NEEDS_GPU}, and this rank sees no GPU")
    init_process_group()
    strategy.__class__ = _hora_subclass(type(strategy))
    strategy.cluster_environment = environment_class(flavor.name)()
    if name == "ModelParallelStrategy":
        size = hn.size()
        tp = strategy._tensor_parallel_size
        if tp == "auto":
            tp = strategy._tensor_parallel_size = 1
        if strategy._data_parallel_size == "auto":
            if size % tp:
                raise ConfigError(f"ModelParallelStrategy(tensor_parallel_size={tp}) does not divide hora's {size} "
                                  "ranks; choose num_proc as a multiple of it")
            strategy._data_parallel_size = size // tp
        if strategy._data_parallel_size * tp != size:
            raise ConfigError(
                f"ModelParallelStrategy(data_parallel_size={strategy._data_parallel_size}, tensor_parallel_size={tp}) "
                f"needs {strategy._data_parallel_size * tp} ranks; hora's job has {size}"
            )
        if strategy._save_distributed_checkpoint:
            log.info("ModelParallelStrategy on hora: each epoch's checkpoint is written whole by rank 0 (hora "
                     "stores it in the run), not as a folder of shards")
            strategy._save_distributed_checkpoint = False
    else:
        if getattr(strategy, "_state_dict_type", "full") != "full":
            log.info("FSDPStrategy on hora: each epoch's checkpoint is written whole by rank 0 (hora stores it in "
                     "the run), not as sharded files")
            strategy._state_dict_type = "full"
    return strategy


def full_state_dict(trainer: Any, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trained module's whole ``state_dict`` on the CPU, on rank 0 (empty on the other
    ranks); every rank must call it (the shards are gathered)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    wrapped = trainer.strategy.model if trainer.strategy.model is not None else module
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(wrapped, options=options)
    return {k: v.detach().cpu().clone() for k, v in state.items()}


_SUBCLASSES: dict[type, type] = {}


def _hora_subclass(cls: type) -> type:
    """``cls`` with its device chosen as :class:`hora.lightning.Strategy` chooses it (the CPU, or
    this rank's GPU by hora's local rank), and a class Lightning's CPU check does not single out."""
    from hora.lightning.strategy import Strategy

    if cls in _SUBCLASSES.values():
        return cls
    if cls not in _SUBCLASSES:
        _SUBCLASSES[cls] = type(f"Hora{cls.__name__}", (cls,), {
            "root_device": Strategy.root_device, "__module__": __name__, "__qualname__": f"Hora{cls.__qualname__}",
        })
    return _SUBCLASSES[cls]


__all__ = ["SHARDED_STRATEGIES", "check_sharded_strategy", "full_state_dict", "on_hora_ranks", "sharded_class_name"]
