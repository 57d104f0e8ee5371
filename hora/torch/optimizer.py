"""``DistributedOptimizer``: average gradients across ranks while backward still runs.

The wrapper is a dynamic subclass of the wrapped optimizer's class (as in Horovod), so
``isinstance(opt, torch.optim.SGD)``, ``state_dict()``, ``load_state_dict()``,
``param_groups`` and learning-rate schedulers keep working on it.

How a step goes:

1. ``loss.backward()``: a *post-accumulate-grad hook* on every parameter fires as soon
   as autograd has written that parameter's ``.grad``. Parameters are grouped into
   buckets, DDP style (reverse registration order, the first of 1 MiB, then up to
   ``bucket_cap_mb``). By default (``gradient_as_bucket_view``) each bucket owns one
   flat buffer and every ``.grad`` is a view of it; the hook points ``.grad`` at its
   view (copying a gradient autograd made anew, scaled by ``1/size`` on the way when
   that is exact), and when the bucket's last gradient is in, the whole buffer is
   submitted as one in-place allreduce (``"grad.bucket.<i>.<first name>"``). The engine
   reduces it in its background thread while autograd computes the remaining
   gradients: communication overlaps the rest of backward, and nothing is copied back.
   With ``gradient_as_bucket_view=False`` each gradient is submitted under its own
   name (``"grad." + parameter name``), as in Horovod, and the engine fuses them.
2. ``optimizer.step()``: waits only for what is still in flight (``synchronize()``),
   then runs the wrapped optimizer's ``step``.

Parameters that got no gradient in a step on this rank (a branch not taken, a frozen
head) are submitted as zeros at ``synchronize()`` time, so ranks that did compute
them never wait forever. ``backward_passes_per_step=k`` accumulates gradients
locally for ``k`` backward passes and reduces once; as in Horovod the average divides
by the number of ranks only, so scale each micro-batch loss by ``1/k`` yourself.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch

import hora.native as _hn
from hora import settings
from hora.errors import ConfigError
from hora.torch import adasum_optimizer as _adasum
from hora.torch._wrap import wrap_instance
from hora.torch.reducer import (  # noqa: F401  (DEFAULT_BUCKET_CAP_MB and the bucket sizes: this module's names too)
    DEFAULT_BUCKET_CAP_MB, ENV_BUCKET_CAP_MB, FIRST_BUCKET_BYTES, SMALL_BUCKET_BYTES, DistributedMixin)

def DistributedOptimizer(  # noqa: N802  (Horovod's name)
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: Any = _hn.Compression.none,
    backward_passes_per_step: int = 1,
    op: Any = _hn.Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = _hn.global_process_set,
    *,
    bucket_cap_mb: float | None = None,
    gradient_as_bucket_view: bool = True,
    first_bucket_mb: float | None = None,
    sharding: str | None = None,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that gradients are averaged across ranks before each step.

    Horovod's signature (positional order included), plus hora's bucketing keywords.

    Args:
        optimizer: any ``torch.optim.Optimizer``; the returned object is an instance of
            its class and shares its ``param_groups`` and ``state`` (use the returned
            object from now on).
        named_parameters: ``model.named_parameters()``; gradients are matched across
            ranks by these names. Without it names come from positions in
            ``param_groups`` (identical models on every rank give identical names).
        compression: ``Compression.none`` (default), ``.fp16`` or ``.bf16``: the wire
            format of the reduction.
        backward_passes_per_step: reduce once every this many backward passes,
            accumulating locally in between. The reduction averages over ranks only:
            divide each micro-batch loss by this number to average over passes too.
        op: ``Average`` (default), ``Sum``, or ``Adasum``: then, as Horovod, each rank
            steps the wrapped optimizer on its own gradients and the *updates* are
            combined with Adasum (:mod:`hora.torch.adasum_optimizer`).
        gradient_predivide_factor: with ``Average``, scale by ``1/f`` before the sum and
            by ``f/size`` after it (guards fp16 sums against overflow).
        num_groups: deprecated (Horovod's): the same as ``groups=num_groups``.
        groups: reduce these parameters together: a number of groups to split the
            parameters into, or lists of parameters (each list one group, every other
            parameter alone). Replaces the size-based buckets below.
        sparse_as_dense: reduce sparse gradients (``nn.Embedding(sparse=True)``) as dense
            tensors and make them sparse again; by default they are reduced by an
            allgather of their indices and values, as Horovod.
        process_set: the ranks that reduce together (default: all).
        bucket_cap_mb: groups consecutive parameters (in reverse registration order, about
            the order backward produces their gradients) into buckets, DDP style: the
            first of up to ``first_bucket_mb``, the others of up to this many MiB
            (default 25, or ``HORA_BUCKET_CAP_MB``). A bucket is submitted once all its
            gradients are ready and negotiated as one group, so a bucket is reduced
            while backward still computes the next ones. 0 submits each gradient the
            moment backward produces it and lets the engine gather them.
        gradient_as_bucket_view: each bucket owns one flat buffer and every ``.grad`` is
            a view of it, reduced in place (default); False: each gradient is reduced
            under its own name and the engine fuses them.
        first_bucket_mb: the size of the first bucket. Default: 1 MiB (as DDP) when
            any parameter is on a GPU, where the reduction of the last layers then
            overlaps the rest of backward at no cost; ``bucket_cap_mb`` when all are on
            the CPU, where the reduction runs on the cores backward computes on, so an
            early small bucket buys no overlap, only one more round per step (bench_ddp's
            MLP, 2 ranks on 2 cores, benchmarks/README.md: 0.93 x DDP with a 1 MiB first
            bucket against 1.03 x with one in one run, 0.97 against 0.98 in another; DDP
            itself is as fast or faster with one bucket). A bigger model still gets
            several buckets that overlap.
        sharding: ``None`` (default): every rank keeps the whole optimizer state.
            ``"optimizer"`` (ZeRO stage 1): each rank keeps the state of its share of
            the parameters, steps those and allgathers the rest; ``"gradients"`` (ZeRO
            stage 2): besides, gradients are reduce-scattered during backward and each
            rank keeps only its share. Adds ``clip_grad_norm_``, sharded
            ``state_dict()`` and ``consolidated_state_dict()``; see
            :mod:`hora.torch.sharded_optimizer` (needs ``hora.torch.init()`` first).

    Raises:
        ConfigError: bad ``named_parameters`` (duplicate names, a parameter missing),
            ``backward_passes_per_step < 1``, an unknown ``op`` or compression,
            ``gradient_predivide_factor`` with an op other than Average, bad ``groups``,
            a negative ``bucket_cap_mb``, ``first_bucket_mb <= 0``, or ranks whose
            buckets differ (first step). All are ValueErrors, as Horovod's.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(
            f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    if isinstance(optimizer, (DistributedMixin, _adasum.AdasumMixin)):
        raise ConfigError("this optimizer is already a DistributedOptimizer; wrap the plain optimizer once")
    op = _hn.Average if op is None else op
    process_set = _hn.global_process_set if process_set is None else process_set
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    if sharding is not None:
        from hora.torch.sharded_optimizer import wrap_sharded

        if op == _hn.Adasum:
            raise ConfigError(f"DistributedOptimizer(sharding={sharding!r}) reduces with Average or Sum, not Adasum")
        cap = _default_bucket_cap_mb() if bucket_cap_mb is None else bucket_cap_mb
        return wrap_sharded(optimizer, sharding, (
            named_parameters, compression, backward_passes_per_step, op, gradient_predivide_factor, process_set,
            cap, gradient_as_bucket_view, first_bucket_mb, None, sparse_as_dense), groups, cap,
            gradient_as_bucket_view)
    if op == _hn.Adasum and _hn.size() > 1:  # (size(): NotInitializedError before init, as Horovod)
        return _adasum.wrap(optimizer, named_parameters, compression, backward_passes_per_step, process_set)
    dist = wrap_instance(optimizer, DistributedMixin)
    dist._hora_setup(
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        process_set,
        _default_bucket_cap_mb() if bucket_cap_mb is None else bucket_cap_mb,
        gradient_as_bucket_view,
        first_bucket_mb,
        groups,
        sparse_as_dense,
    )
    return dist


def _default_bucket_cap_mb() -> float:
    """``HORA_BUCKET_CAP_MB`` (default 25, as DDP's)."""
    return float(settings.get(ENV_BUCKET_CAP_MB))


def is_distributed_optimizer(optimizer: Any) -> bool:
    """True when ``optimizer`` was returned by :func:`DistributedOptimizer`."""
    return isinstance(optimizer, (DistributedMixin, _adasum.AdasumMixin))
