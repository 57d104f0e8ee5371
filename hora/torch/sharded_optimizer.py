"""Sharded data parallelism (ZeRO stages 1 and 2) over hora's own collectives.

``hora.torch.DistributedOptimizer(opt, ..., sharding="optimizer" | "gradients")``
returns an optimizer of ``opt``'s class whose *state* lives on one rank per parameter:

* Ownership: the gradient buckets of :class:`~hora.torch.optimizer.DistributedOptimizer`
  (reverse registration order, up to ``bucket_cap_mb``) are split across the ranks
  parameter by parameter, largest first, each to the rank that owns the fewest elements
  of that bucket so far (ties go to the rank owning the fewest elements overall, so
  buckets of a single parameter spread over the ranks). Every rank computes the same assignment. A bucket is
  laid out as ``size`` rows of equal width ``W`` (row ``r``: the parameters rank ``r``
  owns, then zero padding); ``W`` is the largest owner's share of the bucket.
* ``"optimizer"`` (ZeRO-1): gradients are allreduced exactly as the unsharded optimizer
  does (bucketed, overlapping backward); each rank steps an inner optimizer built over
  the parameters it owns only, so the moments exist only for those; then every bucket's
  rows are gathered (an in-place Sum allreduce of a buffer holding zeros but this rank's
  rows: exact, and the engine's in-place path; at most :data:`MAX_IN_FLIGHT` buckets in flight, so the
  transient is a few buckets, not a second copy of the model) and each rank copies in
  the parameters others updated. A bucket of a single parameter (one larger than the
  bucket cap: an embedding, a vocabulary head) is one rank's whole: that parameter is
  broadcast in place from its owner, with no buffer (its rows would cost ``size`` times it).
* ``"gradients"`` (ZeRO-2): as above, but each bucket's flat ``[size, W]`` buffer (whose
  views are the ``.grad`` of its parameters during backward) is *reduce-scattered* when
  its last gradient is in: rank ``r`` receives row ``r``, its parameters' reduced
  gradients, and the bucket buffer is dropped; the ``.grad`` of parameters other ranks
  own becomes ``None``. At most :data:`MAX_IN_FLIGHT` buckets are in flight during
  backward, so the full-size gradient buffers do not pile up. A bucket of a single
  parameter has no flat buffer: autograd's gradient is allreduced in place (as unsharded)
  and dropped at once on the ranks that do not own it, so its peak is that one gradient,
  not ``size`` rows of it plus a received row.

Gradient compression (``Compression.fp16`` / ``bf16``) applies to the reduction in both
modes (the allreduce, or the reduce-scatter's wire); the parameter allgather always
sends the parameters' own dtype (compressing the weights themselves would change the
model, not just its gradients). Sparse gradients, ``op=Adasum``, explicit ``groups`` and
``bucket_cap_mb=0`` are not supported with sharding (ConfigError / NotImplementedError).
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

import torch

import hora.native as _hn
from hora.errors import ConfigError
from hora.native import ops as _ops
from hora.torch import sharded_state as _state
from hora.torch._wrap import wrap_instance
from hora.torch.reducer import DistributedMixin

SHARDINGS = ("optimizer", "gradients")
MAX_IN_FLIGHT = 2  # buckets whose reduce-scatter / parameter allgather may be pending at once
#: a parameter of at least this many bytes, or this part of the bucket cap, is a bucket of its own
#: (see _hora_plan_buckets)
LONE_BYTES = 1 << 20
LONE_FRACTION = 0.25
# optimizers that keep state not attached to one parameter (LBFGS keeps its history in the
# first parameter's entry and steps all parameters as one vector)
NOT_PER_PARAMETER = (torch.optim.LBFGS,)


@dataclass(frozen=True)
class BucketShard:
    """How one gradient bucket is split across the ranks.

    Attributes:
        owners: the owning rank (position in the process set) of each parameter of the bucket.
        offsets: where each parameter starts in its owner's row.
        rows: per rank, the positions (in the bucket) of the parameters it owns, in bucket order.
        width: the row width ``W`` (the largest owner's share, in elements).
    """

    owners: tuple[int, ...]
    offsets: tuple[int, ...]
    rows: tuple[tuple[int, ...], ...]
    width: int


def assign_owners(bucket_numels: list[list[int]], size: int) -> list[BucketShard]:
    """Split every bucket's parameters (given by their element counts) across ``size`` ranks.

    Within a bucket, parameters go largest first into the one of ``size`` rows holding the
    fewest elements so far (so that the bucket's rows are even); then the fullest row goes
    to the rank owning the fewest elements of all buckets so far, the next fullest to the
    next, ties to rank ``(bucket + k) % size`` for the smallest ``k``. Buckets are placed
    largest first (the rule of longest job first), so that the ranks' totals come out even:
    a lone parameter larger than the bucket cap (an embedding, a vocabulary head) goes first,
    and the buckets of ordinary size even out what it left uneven.
    Deterministic: every rank computes the same result from the same sizes.
    """
    out: list[BucketShard | None] = [None] * len(bucket_numels)
    total = [0] * size
    for b in sorted(range(len(bucket_numels)), key=lambda b: (-sum(bucket_numels[b]), b)):
        numels = bucket_numels[b]
        load = [0] * size
        group = [0] * len(numels)
        for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
            g = min(range(size), key=lambda g: (load[g], g))
            group[i] = g
            load[g] += numels[i]
        ranks = sorted(range(size), key=lambda r: (total[r], (r - b) % size))
        rank_of = dict(zip(sorted(range(size), key=lambda g: (-load[g], g)), ranks))
        owners = [rank_of[g] for g in group]
        for g, r in rank_of.items():
            total[r] += load[g]
        rows: list[list[int]] = [[] for _ in range(size)]
        offsets = [0] * len(numels)
        fill = [0] * size
        for i, r in enumerate(owners):
            rows[r].append(i)
            offsets[i] = fill[r]
            fill[r] += numels[i]
        out[b] = BucketShard(tuple(owners), tuple(offsets), tuple(tuple(r) for r in rows), max(fill, default=0))
    return out  # type: ignore[return-value]


def split_large(buckets: list[list[torch.Tensor]], lone_bytes: float) -> list[list[torch.Tensor]]:
    """``buckets`` with every parameter of at least ``lone_bytes`` in a bucket of its own (in
    place, the order kept): the parameters between two such are the next bucket."""
    out: list[list[torch.Tensor]] = []
    for bucket in buckets:
        rest: list[torch.Tensor] = []
        for p in bucket:
            if p.numel() * p.element_size() >= lone_bytes:
                if rest:
                    out.append(rest)
                    rest = []
                out.append([p])
            else:
                rest.append(p)
        if rest:
            out.append(rest)
    return out


class _ShardedMixin(DistributedMixin):
    """ZeRO-1: the unsharded reduction, a step over this rank's parameters, an allgather."""

    _hora_sharding = "optimizer"

    def _hora_plan_buckets(self, cap_bytes: float, first_bytes: float, by_layout: bool) -> list[list[torch.Tensor]]:
        """The unsharded buckets; a parameter of at least :data:`LONE_BYTES` (or :data:`LONE_FRACTION`
        of the cap, if less) is *large*: the parameter gather broadcasts it in place from its
        owner, with no buffer (:meth:`_hora_gather_params`), and ZeRO-2 gives it a bucket of its
        own. In a bucket's flat buffer of ``size`` rows, one large parameter made every row
        that wide: 8 x ``Linear(2048, 2048)`` on 2 ranks, buckets of one weight and two biases,
        gathered through 32 MiB buffers three at a time, peaked as high as the replicated run;
        a model of small layers in one bucket had a gather buffer the size of all its parameters.
        What is left in flat buffers is the small parameters (biases, norms)."""
        self._hora_lone_at = min(LONE_BYTES, LONE_FRACTION * cap_bytes)
        return super()._hora_plan_buckets(cap_bytes, first_bytes, by_layout)

    def _hora_shard_setup(self, raw: torch.optim.Optimizer) -> None:
        if isinstance(raw, NOT_PER_PARAMETER):
            raise ConfigError(
                f"DistributedOptimizer(sharding={self._hora_sharding!r}) needs an optimizer whose state is per "
                f"parameter; {type(raw).__name__} keeps state across parameters"
            )
        if self._hora_op not in (_hn.Average, _hn.Sum):
            raise ConfigError(f"DistributedOptimizer(sharding={self._hora_sharding!r}) reduces with op=Average or "
                              f"Sum, got op={self._hora_op!r}")
        ps = self._hora_process_set
        ranks = list(ps.ranks) if ps.ranks is not None else list(range(_hn.size()))
        me = _hn.rank()
        if me not in ranks:
            raise ConfigError(f"DistributedOptimizer(sharding=...): rank {me} is not in the process set {ranks}")
        self._hora_ranks = ranks
        self._hora_me = ranks.index(me)
        self._hora_shards = assign_owners([[p.numel() for p in bucket] for bucket in self._hora_buckets], len(ranks))
        self._hora_owned = [p for bucket, shard in zip(self._hora_buckets, self._hora_shards)
                            for p, r in zip(bucket, shard.owners) if r == self._hora_me]
        owned = set(self._hora_owned)
        seen: set[torch.Tensor] = set()
        groups = []
        for g in self.param_groups:  # type: ignore[attr-defined]
            mine = [p for p in g["params"] if p in owned and p not in seen]
            seen.update(mine)
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": mine})
        # the same class, hyperparameters and settings, over this rank's parameters only (a
        # copy rather than a new construction: not every optimizer's defaults are arguments of
        # its __init__, AdamW's decoupled_weight_decay for one)
        inner = object.__new__(type(raw))
        inner.__dict__.update({k: v for k, v in raw.__dict__.items() if k != "step"})  # (an LR scheduler's wrapper)
        inner.state = defaultdict(dict)
        inner.param_groups = []
        for g in groups:
            inner.add_param_group(g)
        for p in self._hora_owned:  # state the plain optimizer already had (e.g. loaded before wrapping)
            if p in raw.state:
                inner.state[p] = raw.state[p]
        self._hora_inner = inner
        self.state = inner.state  # type: ignore[assignment]
        self._hora_state_checked = False
        self._hora_param_names = [f"zero.params.{b}.{self._hora_names[bucket[0]]}"
                                  for b, bucket in enumerate(self._hora_buckets)]
        # buckets of one (contiguous) parameter: the whole bucket is one rank's; its parameter is
        # broadcast in place from its owner, and under ZeRO-2 its gradient reduced in place
        self._hora_alone = [len(bucket) == 1 and bucket[0].is_contiguous() for bucket in self._hora_buckets]
        # the gather of a bucket of several: its large (contiguous) parameters broadcast in place,
        # the small ones in rows of `small_width` (their offsets in their owner's row)
        self._hora_gather_plan = []
        for bucket, shard in zip(self._hora_buckets, self._hora_shards):
            large = tuple(p.is_contiguous() and p.numel() * p.element_size() >= self._hora_lone_at for p in bucket)
            fill = [0] * len(ranks)
            offsets = [0] * len(bucket)
            for i, (p, r) in enumerate(zip(bucket, shard.owners)):
                if not large[i]:
                    offsets[i] = fill[r]
                    fill[r] += p.numel()
            self._hora_gather_plan.append((large, tuple(offsets), max(fill, default=0)))

    # ---------------------------------------------------------------- stepping
    def step(self, closure: Any = None) -> Any:
        """Reduce the gradients (unless already synchronized), step this rank's parameters
        with the inner optimizer, then allgather every rank's updated parameters.

        Returns the closure's loss (see :meth:`DistributedOptimizer.step`)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._hora_should_sync and not self._hora_synchronized:
            self.synchronize()
        self._hora_synchronized = False
        self._hora_sync_groups()
        self._hora_inner.step()
        if not self._hora_state_checked:
            self._hora_check_state()
        self._hora_gather_params()
        return loss

    def _hora_sync_groups(self) -> None:
        """Copy the hyperparameters of the public param groups (an LR scheduler changes
        those) into the inner optimizer's groups."""
        for outer, inner in zip(self.param_groups, self._hora_inner.param_groups):  # type: ignore[attr-defined]
            for k, v in outer.items():
                if k != "params":
                    inner[k] = v

    def _hora_check_state(self) -> None:
        """Once, after the first step: every state entry must belong to one owned parameter."""
        self._hora_state_checked = True
        owned = set(self._hora_owned)
        if any(not isinstance(k, torch.Tensor) or k not in owned for k in self._hora_inner.state):
            raise ConfigError(f"DistributedOptimizer(sharding={self._hora_sharding!r}): "
                              f"{type(self._hora_inner).__name__} keeps state that is not per parameter")

    def _hora_gather_params(self) -> None:
        """Every rank's updated parameters on every rank: a bucket of one parameter, and each large
        parameter of a bucket (:meth:`_hora_plan_buckets`), broadcast in place from its owner; a
        bucket's small parameters gathered through one flat buffer; copied in where others own them."""
        if len(self._hora_ranks) == 1:
            return
        pending: deque[tuple[int, int | None, Any]] = deque()
        ps = self._hora_process_set

        def queued(b: int, i: int | None, handle: Any) -> None:
            pending.append((b, i, handle))
            if len(pending) > MAX_IN_FLIGHT:
                self._hora_copy_in(*pending.popleft())

        with torch.no_grad():
            for b, (bucket, shard) in enumerate(zip(self._hora_buckets, self._hora_shards)):
                if self._hora_alone[b]:
                    queued(b, 0, _ops.broadcast_async_(bucket[0].data, root_rank=self._hora_ranks[shard.owners[0]],
                                                       name=self._hora_param_names[b], process_set=ps))
                    continue
                large, offsets, width = self._hora_gather_plan[b]
                for i, p in enumerate(bucket):
                    if large[i]:
                        queued(b, i, _ops.broadcast_async_(p.data, root_rank=self._hora_ranks[shard.owners[i]],
                                                           name=f"{self._hora_param_names[b]}.{i}", process_set=ps))
                if not width:
                    continue
                # every rank's rows of small parameters in one buffer, zeros but its own, summed in
                # place: exact (x + 0 == x) and the engine's in-place allreduce path (an allgather's
                # output buffers were kept by the engine between steps: RSS grew each step)
                p0 = bucket[0]
                flat = torch.zeros(len(self._hora_ranks) * width, dtype=p0.dtype, device=p0.device)
                base = self._hora_me * width
                for i in shard.rows[self._hora_me]:
                    if not large[i]:
                        n = bucket[i].numel()
                        flat[base + offsets[i]:base + offsets[i] + n].copy_(bucket[i].reshape(-1))
                queued(b, None, _ops.allreduce_async_(flat, op=_hn.Sum, name=self._hora_param_names[b],
                                                      process_set=ps))
            while pending:
                self._hora_copy_in(*pending.popleft())

    def _hora_copy_in(self, b: int, i: int | None, handle: Any) -> None:
        """Wait for a gather: a broadcast (``i``: the parameter) wrote in place; a flat buffer's small
        parameters others own are copied in."""
        gathered = handle.synchronize()
        if i is not None:
            return
        bucket, shard = self._hora_buckets[b], self._hora_shards[b]
        large, offsets, width = self._hora_gather_plan[b]
        dst, src = [], []
        for k, (r, off) in enumerate(zip(shard.owners, offsets)):
            if r != self._hora_me and not large[k]:
                p = bucket[k]
                start = r * width + off
                dst.append(p.data)
                src.append(gathered[start:start + p.numel()].view(p.shape))
        if dst:
            torch._foreach_copy_(dst, src)

    # ---------------------------------------------------------------- clipping
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the reduced gradients by their global norm across all shards, as
        ``torch.nn.utils.clip_grad_norm_`` would on the whole model; returns the norm.

        Reduces the gradients first if this step has not been synchronized (then
        ``step()`` does not reduce them again).

        Raises:
            ConfigError: ``max_norm`` is not a number > 0 or ``norm_type`` not > 0.
        """
        try:
            max_norm, norm_type = float(max_norm), float(norm_type)
        except (TypeError, ValueError):
            raise ConfigError(f"clip_grad_norm_: max_norm and norm_type must be numbers, got {max_norm!r}, "
                              f"{norm_type!r}") from None
        if not max_norm > 0 or not norm_type > 0:
            raise ConfigError(f"clip_grad_norm_: max_norm and norm_type must be > 0, got {max_norm}, {norm_type}")
        if not self._hora_synchronized:
            self.synchronize()
        grads = [p.grad for p in self._hora_owned if p.grad is not None]
        p0 = self._hora_owned[0] if self._hora_owned else self._hora_requires_update[0]
        local = torch.zeros((), dtype=torch.float64, device=p0.device)
        inf = math.isinf(norm_type)
        for g in grads:
            n = torch.linalg.vector_norm(g.detach().double(), norm_type)
            local = torch.maximum(local, n) if inf else local + n ** norm_type
        total = local
        if len(self._hora_ranks) > 1:
            total = _ops.allreduce(local.reshape(1), op=_hn.Max if inf else _hn.Sum, name="zero.grad_norm",
                                   process_set=self._hora_process_set).reshape(())
        norm = total if inf else total ** (1.0 / norm_type)
        coef = max_norm / (float(norm) + 1e-6)
        if coef < 1.0:
            everything = [p.grad for p in self._hora_requires_update if p.grad is not None]
            torch._foreach_mul_(everything, coef)
        return norm.to(p0.dtype)

    # ---------------------------------------------------------------- state
    def _hora_broadcast_hyperparameters(self, root_rank: int) -> None:
        """``broadcast_optimizer_state`` of a sharded optimizer: every param group's
        hyperparameters from ``root_rank``; the state stays each rank's own shard."""
        if len(self._hora_ranks) == 1:
            return
        mine = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]  # type: ignore[attr-defined]
        theirs = _hn.broadcast_object(mine, root_rank=root_rank, name="zero.hyperparameters",
                                      process_set=self._hora_process_set)
        if len(theirs) != len(mine):
            raise ConfigError(f"broadcast_optimizer_state: rank {root_rank} has {len(theirs)} param groups, "
                              f"rank {_hn.rank()} {len(mine)}")
        for g, h in zip(self.param_groups, theirs):  # type: ignore[attr-defined]
            g.update(h)
        self._hora_sync_groups()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise NotImplementedError("a sharded DistributedOptimizer cannot add parameter groups after wrapping; "
                                  "add them to the plain optimizer before DistributedOptimizer(...)")

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard: the state of the parameters it owns, keyed by parameter name,
        with every param group's hyperparameters and names (see :mod:`hora.torch.sharded_state`)."""
        return _state.shard_state_dict(self)

    def consolidated_state_dict(self, to_rank: int | None = 0) -> dict[str, Any] | None:
        """The whole optimizer's state in torch's own format (loadable into the plain
        optimizer or an unsharded DistributedOptimizer) on ``to_rank``; ``None`` elsewhere
        (``to_rank=None``: on every rank). Every rank must call it (it gathers the shards).

        Raises:
            ConfigError: ``to_rank`` is not a rank of the process set.
        """
        return _state.consolidated_state_dict(self, to_rank)

    def load_state_dict(self, state_dict: Any) -> None:
        """Load a shard saved at the same size and rank, every rank's shards (a list,
        from any size: resharded), or a consolidated (torch-format) state dict.

        Raises:
            ConfigError: the checkpoint is of another model (naming the first mismatching
                parameter), or a lone shard from another size or rank.
        """
        self._hora_forget_step()
        _state.load_into(self, state_dict)

    def save_sharded_state_dict(self, path: str, store: Any = None) -> str:
        """Write this rank's shard atomically to ``path`` (a folder; in ``store`` when given,
        a :class:`hora.store.Store`), as ``shard-<rank>-of-<size>.pt``; returns the file's path."""
        return _state.save_shard(self, path, store)

    def load_sharded_state_dict(self, path: str, store: Any = None) -> None:
        """Load the shards :meth:`save_sharded_state_dict` wrote to ``path`` at any number of
        ranks, keeping the entries this rank owns now.

        Raises:
            StoreError / ConfigError: shards missing or from two sizes, or another model.
        """
        self._hora_forget_step()
        _state.load_into(self, _state.read_shards(path, store))


class _GradShardMixin(_ShardedMixin):
    """ZeRO-2: each bucket reduce-scattered during backward; only owned gradients kept."""

    _hora_sharding = "gradients"

    def _hora_plan_buckets(self, cap_bytes: float, first_bytes: float, by_layout: bool) -> list[list[torch.Tensor]]:
        """ZeRO-1's buckets with each large parameter in a bucket of its own: its gradient is
        reduced in place (and dropped where another rank owns it), with no reduce-scatter buffer
        of ``size`` rows as wide as it."""
        planned = super()._hora_plan_buckets(cap_bytes, first_bytes, by_layout)
        return split_large(planned, self._hora_lone_at)

    def _hora_shard_setup(self, raw: torch.optim.Optimizer) -> None:
        super()._hora_shard_setup(raw)
        nb = len(self._hora_buckets)
        # every bucket but one of a single parameter has a flat [size, W] buffer of our layout
        # (a lone parameter's row would be the whole parameter: `size` times its gradient)
        self._hora_flat_ok = [not alone for alone in self._hora_alone]
        self._hora_small = [False] * nb
        self._hora_layout_checked = False
        self._hora_pending: deque[int] = deque()
        self._hora_grad_names = [f"zero.grad.{b}.{self._hora_names[bucket[0]]}"
                                 for b, bucket in enumerate(self._hora_buckets)]

    def _hora_make_flat(self, b: int) -> None:
        shard, bucket = self._hora_shards[b], self._hora_buckets[b]
        p0 = bucket[0]
        flat = torch.zeros(len(self._hora_ranks) * shard.width, dtype=p0.dtype, device=p0.device)
        for p, r, off in zip(bucket, shard.owners, shard.offsets):
            start = r * shard.width + off
            self._hora_slots[p].view = flat[start:start + p.numel()].view(p.shape)
        self._hora_flats[b] = flat

    def _hora_submit_bucket(self, b: int) -> None:
        self._hora_submitted[b] = True
        self._hora_counted = True
        if not self._hora_flat_ok[b]:
            self._hora_submit_alone(b)
            return
        if self._hora_flats[b] is None:
            self._hora_make_flat(b)
        for s in self._hora_bucket_slots[b]:
            if s.sparse:
                raise NotImplementedError(f"DistributedOptimizer(sharding='gradients'): the gradient of {s.name!r} "
                                          "is sparse; sharded gradients are dense only")
            if s.p.grad is not s.view:
                self._hora_adopt(s, s.view)
        if not self._hora_layout_checked:
            self._hora_check_layout()
        flat = self._hora_flats[b].view(len(self._hora_ranks), -1)
        wire, ctx = self._hora_compression.compress(flat)
        handle = _ops.reducescatter_async(wire, op=self._hora_op, name=self._hora_grad_names[b],
                                          process_set=self._hora_process_set,
                                          prescale_factor=self._hora_prescale, postscale_factor=self._hora_postscale)
        self._hora_handles[b] = (handle, ctx)
        self._hora_pending.append(b)
        self._hora_drain(MAX_IN_FLIGHT)

    def _hora_submit_alone(self, b: int) -> None:
        """A bucket of one parameter: its gradient (autograd's own tensor) allreduced in place,
        as the unsharded optimizer does; :meth:`_hora_finish` drops it on the other ranks."""
        s = self._hora_bucket_slots[b][0]
        if s.sparse:
            raise NotImplementedError(f"DistributedOptimizer(sharding='gradients'): the gradient of {s.name!r} "
                                      "is sparse; sharded gradients are dense only")
        if s.p.grad is None:  # this rank computed none this step, another may have: reduce zeros
            s.p.grad = torch.zeros_like(s.p, memory_format=torch.preserve_format)
        self._hora_handles[b] = (self._hora_allreduce(s.p.grad, self._hora_grad_names[b]), None)
        self._hora_pending.append(b)
        self._hora_drain(MAX_IN_FLIGHT)

    def _hora_drain(self, limit: int) -> None:
        """Finish buckets in submission order while more than ``limit`` are pending or the
        oldest is already done."""
        pending = self._hora_pending
        while pending and (len(pending) > limit or self._hora_handles[pending[0]][0].poll()):
            self._hora_finish(pending.popleft())

    def _hora_finish(self, b: int) -> None:
        """Bucket ``b``'s row is in: owned ``.grad`` become views of it, the others None."""
        handle, ctx = self._hora_handles.pop(b)
        if not self._hora_flat_ok[b]:  # a lone parameter's gradient, reduced in place
            handle.synchronize()
            if self._hora_shards[b].owners[0] != self._hora_me:
                self._hora_bucket_slots[b][0].p.grad = None
            return
        row = self._hora_compression.decompress(handle.synchronize(), ctx).reshape(-1)
        shard = self._hora_shards[b]
        for s, r, off in zip(self._hora_bucket_slots[b], shard.owners, shard.offsets):
            s.view = None
            s.p.grad = row[off:off + s.p.numel()].view(s.p.shape) if r == self._hora_me else None
        self._hora_flats[b] = None

    def synchronize(self) -> None:
        """Submit what is left of this step and wait until every bucket's shard of
        gradients is in ``.grad`` (others' parameters: ``None``).

        Raises:
            CollectiveError: a reduction failed or ranks disagree about a bucket.
        """
        if not self._hora_participates():
            self._hora_synchronized = True
            return
        try:
            for b in range(len(self._hora_buckets)):
                if not self._hora_submitted[b]:
                    self._hora_submit_bucket(b)
            self._hora_drain(0)
        finally:
            self._hora_handles.clear()
            self._hora_pending.clear()
            self._hora_reset_counts()
        self._hora_synchronized = True

    def _hora_forget_step(self) -> None:
        super()._hora_forget_step()
        self._hora_pending.clear()
        for s in self._hora_slots.values():
            s.view = None
        self._hora_flats = [None] * len(self._hora_buckets)


def wrap_sharded(optimizer: torch.optim.Optimizer, sharding: str, setup_args: tuple,
                 groups: Any, bucket_cap_mb: float, gradient_as_bucket_view: bool) -> torch.optim.Optimizer:
    """The sharded DistributedOptimizer (called by :func:`hora.torch.DistributedOptimizer`).

    Raises:
        ConfigError: an unknown ``sharding``, ``groups``, ``bucket_cap_mb=0``,
            ``gradient_as_bucket_view=False``, an op other than Average/Sum, or an
            optimizer whose state is not per parameter.
        NotInitializedError: before ``hora.torch.init()`` (the shards need the size).
    """
    if sharding not in SHARDINGS:
        raise ConfigError(f"sharding must be None or one of {', '.join(map(repr, SHARDINGS))}, got {sharding!r}")
    if groups:
        raise ConfigError(f"DistributedOptimizer(sharding={sharding!r}) builds its own buckets; groups= is not "
                          "supported with sharding")
    try:
        cap_ok = float(bucket_cap_mb) > 0
    except (TypeError, ValueError):
        cap_ok = False
    if not cap_ok:
        raise ConfigError(f"DistributedOptimizer(sharding={sharding!r}) needs bucket_cap_mb > 0, got {bucket_cap_mb!r}")
    if gradient_as_bucket_view is not True:
        raise ConfigError(f"DistributedOptimizer(sharding={sharding!r}) needs gradient_as_bucket_view=True")
    _hn.size()  # NotInitializedError before init, naming what to call
    mixin = _ShardedMixin if sharding == "optimizer" else _GradShardMixin
    dist = wrap_instance(optimizer, mixin)
    dist._hora_setup(*setup_args)
    dist._hora_shard_setup(optimizer)
    return dist


def owned_parameters(optimizer: Any) -> list[torch.Tensor]:
    """The parameters whose optimizer state this rank keeps (all of them when unsharded)."""
    owned = getattr(optimizer, "_hora_owned", None)
    if owned is not None:
        return list(owned)
    return [p for g in optimizer.param_groups for p in g["params"]]

