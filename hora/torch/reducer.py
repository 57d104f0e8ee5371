"""The gradient reduction behind :func:`hora.torch.DistributedOptimizer`: the mixin put in front of
the wrapped optimizer's class (its slots, gradient hooks, buckets and their flat buffers, the
submission of each bucket while backward runs, ``synchronize`` and ``step``). See
:mod:`hora.torch.optimizer` for how a step goes; :mod:`hora.torch.sharded_optimizer` builds ZeRO on it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

import hora.native as _hn
from hora import settings
from hora.errors import ConfigError
from hora.native import ops as _ops
from hora.torch.buckets import FIRST_BUCKET_BYTES, SMALL_BUCKET_BYTES, checked_options, plan_buckets, viewable
from hora.torch.parameters import explicit_groups, first_difference, normalize_named_parameters

log = logging.getLogger(__name__)

_GRAD_PREFIX = "grad."
ENV_BUCKET_CAP_MB = "HORA_BUCKET_CAP_MB"
DEFAULT_BUCKET_CAP_MB = settings.default(ENV_BUCKET_CAP_MB)  # 25, as DDP


class _Slot:
    """A reduced parameter's state, reached from its hooks without hashing the tensor."""

    __slots__ = ("p", "name", "bucket", "delay", "view", "scaled", "sparse")

    def __init__(self, p: torch.Tensor, name: str, delay: int) -> None:
        self.p = p
        self.name = name
        self.bucket = 0
        self.delay = delay  # backward passes still to come before the reduction
        self.view: torch.Tensor | None = None  # its view of the bucket's flat buffer
        self.scaled = False  # this step, the view holds the gradient times the bucket's fold
        self.sparse = False  # its gradients are sparse (seen once): reduced by name, outside the bucket


class _SparseReduction:
    """The reduction of one sparse gradient; ``synchronize()`` puts the result in ``p.grad``."""

    def __init__(self, p: torch.Tensor, handle: Any, dense: bool) -> None:
        self.p, self.handle, self.dense = p, handle, dense

    def synchronize(self) -> None:
        out = self.handle.synchronize()
        self.p.grad = out.to_sparse() if self.dense else out


class DistributedMixin:
    """Methods mixed in front of the wrapped optimizer class (see DistributedOptimizer)."""

    # set by _hora_setup; declared for type checkers
    _hora_names: dict[torch.Tensor, str]
    _hora_handles: dict[Any, Any]  # parameter, or bucket index for a flat bucket
    _hora_slots: dict[torch.Tensor, _Slot]
    _hora_hooks: list[Any]

    def _hora_setup(
        self,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
        compression: Any,
        backward_passes_per_step: int,
        op: Any,
        gradient_predivide_factor: float,
        process_set: Any,
        bucket_cap_mb: float,
        gradient_as_bucket_view: bool,
        first_bucket_mb: float | None,
        groups: Any = None,
        sparse_as_dense: bool = False,
    ) -> None:
        factor, compression, cap_bytes, first_bytes = checked_options(
            backward_passes_per_step, op, gradient_predivide_factor, compression, bucket_cap_mb, first_bucket_mb,
            gradient_as_bucket_view)
        names = normalize_named_parameters(named_parameters, self.param_groups)  # type: ignore[attr-defined]
        self._hora_names = names
        self._parameter_names = names  # Horovod's attribute: parameter -> name
        self._hora_sparse_as_dense = bool(sparse_as_dense)
        self._hora_compression = compression
        self._hora_bpps = backward_passes_per_step
        # Horovod's public attributes
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = factor
        self.sparse_as_dense = bool(sparse_as_dense)
        self.process_set = process_set
        self._hora_op = op
        # Horovod's split of the average: x * (1/f) summed, then * (f / size) by the engine
        self._hora_prescale = 1.0 / factor if op == _hn.Average else 1.0
        self._hora_postscale = factor if op == _hn.Average else 1.0
        self._hora_process_set = process_set
        self._hora_member: bool | None = None  # decided at the first gradient (needs init)
        self._hora_handles = {}
        self._hora_slots = {}
        self._hora_should_sync = True
        self._hora_synchronized = False
        self._hora_requires_update: list[torch.Tensor] = []
        self._hora_hooks = []
        self._hora_hook_parameters(names, backward_passes_per_step)
        self._hora_make_buckets(names, cap_bytes, first_bytes, gradient_as_bucket_view, groups)

    def _hora_hook_parameters(self, names: dict[torch.Tensor, str], backward_passes_per_step: int) -> None:
        """A slot and the two gradient hooks for every parameter that requires a gradient (once per tensor)."""
        for group in self.param_groups:  # type: ignore[attr-defined]
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                if p in self._hora_slots:  # the same tensor in two groups: hook it once
                    continue
                self._hora_requires_update.append(p)
                slot = self._hora_slots[p] = _Slot(p, names[p], backward_passes_per_step)
                self._hora_hooks.append(p.register_hook(self._hora_guard(slot)))
                self._hora_hooks.append(p.register_post_accumulate_grad_hook(partial(self._hora_on_grad, slot)))

    def _hora_make_buckets(self, names: dict[torch.Tensor, str], cap_bytes: float, first_bytes: float | None,
                           gradient_as_bucket_view: bool, groups: Any) -> None:
        """The buckets of the parameters and each bucket's bookkeeping (its flat buffer comes later)."""
        # Buckets: consecutive parameters in reverse registration order (roughly the order
        # backward produces their gradients), the first up to first_bytes, the others up
        # to cap_bytes; a bucket is submitted when all its gradients are ready and the engine
        # is told it is complete, so each bucket is negotiated and reduced while backward
        # computes the next ones. With gradient_as_bucket_view a bucket holds parameters
        # of one dtype and device only, and owns one flat buffer that their .grad are
        # views of: the bucket is reduced in place as one tensor (no copy in or out).
        self._hora_bucketed = cap_bytes > 0
        self._hora_buckets: list[list[torch.Tensor]] = []
        if first_bytes is None:
            on_cpu = all(p.device.type == "cpu" for p in self._hora_requires_update)
            first_bytes = cap_bytes if on_cpu else FIRST_BUCKET_BYTES
        explicit = explicit_groups(groups, self._hora_requires_update)
        if explicit is not None:  # Horovod's groups: each is reduced as one
            self._hora_bucketed = True
            self._hora_buckets = explicit
        else:
            self._hora_buckets = self._hora_plan_buckets(cap_bytes, first_bytes,
                                                         gradient_as_bucket_view and self._hora_bucketed)
        for b, bucket in enumerate(self._hora_buckets):
            for p in bucket:
                self._hora_slots[p].bucket = b
        # a bucket's flat buffer is made at its first gradient (it needs hora.init())
        self._hora_flat_ok = [gradient_as_bucket_view and len(bucket) > 1 and all(viewable(p) for p in bucket)
                              and len({(p.dtype, p.device) for p in bucket}) == 1 for bucket in self._hora_buckets]
        self._hora_flats = [None] * len(self._hora_buckets)
        self._hora_numel = [sum(p.numel() for p in bucket) for bucket in self._hora_buckets]
        self._hora_room = [False] * len(self._hora_buckets)
        self._hora_fold = [0.0] * len(self._hora_buckets)  # 1/size folded into the copy into the bucket
        self._hora_scale_by: list[tuple | None] = [None] * len(self._hora_buckets)  # see _hora_make_flat
        self._hora_layout_checked = not any(self._hora_flat_ok)
        self._hora_bucket_ready = [0] * len(self._hora_buckets)
        self._hora_submitted = [False] * len(self._hora_buckets)
        self._hora_counted = False  # some hook counted a pass or a bucket was submitted since the last reset
        self._hora_bucket_slots = [[self._hora_slots[p] for p in bucket] for bucket in self._hora_buckets]
        self._hora_bucket_names = [f"{_GRAD_PREFIX}bucket.{b}.{names[bucket[0]]}"
                                   for b, bucket in enumerate(self._hora_buckets)]
        # a small bucket's gradients are copied into it together when it is submitted (one
        # batched copy, then one scaling of the whole bucket), not one by one in their hooks:
        # for small tensors the calls cost more than the bytes; a big bucket's gradient is
        # scaled while it is copied (one pass over it), in its hook, while it is hot
        self._hora_small = [bool(bucket) and n * bucket[0].element_size() <= SMALL_BUCKET_BYTES
                            for n, bucket in zip(self._hora_numel, self._hora_buckets)]

    def _hora_plan_buckets(self, cap_bytes: float, first_bytes: float, by_layout: bool) -> list[list[torch.Tensor]]:
        """The buckets of the parameters that require gradients (:func:`plan_buckets`; the sharded
        optimizers split them further)."""
        return plan_buckets(self._hora_requires_update, cap_bytes, first_bytes, by_layout)

    def _hora_make_flat(self, b: int) -> None:
        """Make bucket ``b``'s flat buffer and point each parameter's view into it.

        On the CPU, with float32/float64 gradients, the global process set, no compression
        and no predivide factor, the buffer keeps the engine's spare room after the
        gradients, so that a predicted round reduces it in place (see
        ``hora.native.ops.bucket_allreduce_async_``)."""
        bucket = self._hora_buckets[b]
        p0 = bucket[0]
        from hora.native.compression import name_of

        room = (p0.device.type == "cpu" and p0.dtype in (torch.float32, torch.float64)
                and self._hora_process_set.process_set_id == 0 and name_of(self._hora_compression) == "none"
                and self._hora_prescale == 1.0)
        total = self._hora_numel[b]
        flat = torch.zeros(total + (_ops.room_elements() if room else 0), dtype=p0.dtype, device=p0.device)
        offset = 0
        for p in bucket:  # (a gradient already there moves into its view at its hook or submit)
            n = p.numel()
            self._hora_slots[p].view = flat[offset:offset + n].view(p.shape)
            offset += n
        self._hora_flats[b] = flat
        self._hora_room[b] = room
        size = self._hora_process_set.size()
        if room and self._hora_op == _hn.Average and self._hora_bpps == 1 and size & (size - 1) == 0:
            # The average's 1/size is applied while the gradient is copied into the bucket
            # (autograd made it anew, the copy happens anyway) and the bucket is summed: one
            # pass over the data fewer. Only for a power-of-two size, where it is exact:
            # x * 2^-k rounds like x, so the result is bitwise that of scaling after the sum.
            self._hora_fold[b] = 1.0 / size
            # a small bucket is scaled whole at submit: through its data's view and the factor
            # as a tensor of its dtype (the same product; a Python number is wrapped into a
            # tensor on every call, which costs more than scaling a small bucket)
            self._hora_scale_by[b] = (flat[:total], torch.tensor(1.0 / size, dtype=flat.dtype))

    # ---------------------------------------------------------------- gradient hooks
    def _hora_guard(self, s: _Slot) -> Any:
        """A hook run *before* autograd accumulates into ``p.grad``: refuse a gradient
        while ``p.grad`` is being reduced in place (it would corrupt the reduction)."""

        def guard(grad: torch.Tensor) -> None:
            if not (self._hora_member or self._hora_participates()):
                return
            if self._hora_submitted[s.bucket] or s.delay <= 0:
                raise ConfigError(
                    f"gradient of {s.name!r} was computed more than "
                    f"backward_passes_per_step={self._hora_bpps} times before optimizer.step() "
                    "or optimizer.synchronize(); raise backward_passes_per_step or call step() "
                    "more often"
                )

        return guard

    def _hora_participates(self) -> bool:
        """Whether this rank reduces at all: a member of a process set of > 1 ranks.

        Raises:
            NotInitializedError: hora.init() was not called.
        """
        member = self._hora_member
        if member is None:
            ps = self._hora_process_set
            member = self._hora_member = ps.included() and ps.size() > 1
        return member

    def _hora_on_grad(self, s: _Slot, p: torch.Tensor) -> None:
        """Post-accumulate-grad hook: count the pass, point ``p.grad`` at the bucket's
        buffer, and submit the bucket when its last gradient is in."""
        if not (self._hora_member or self._hora_participates()):
            return
        b = s.bucket
        if p.grad is not None and p.grad.is_sparse:
            s.sparse = True  # reduced by name, outside the bucket (its view carries zeros)
        elif self._hora_flat_ok[b] and not s.sparse:
            view = s.view
            if view is None:
                self._hora_make_flat(b)
                view = s.view
            if p.grad is not view and not self._hora_small[b]:
                self._hora_adopt(s, view)  # (a small bucket adopts all its gradients at once, at submit)
        s.delay -= 1
        self._hora_counted = True
        if s.delay == 0:
            self._hora_bucket_ready[b] += 1
            if self._hora_bucket_ready[b] == len(self._hora_buckets[b]):
                self._hora_submit_bucket(b)
                if self._hora_bucketed:
                    _ops.end_burst()

    def _hora_adopt(self, s: _Slot, view: torch.Tensor) -> None:
        """Make ``p.grad`` the bucket view ``view``, keeping its value (zeros when
        ``p`` has no gradient). Autograd then accumulates into the view in place."""
        p = s.p
        grad = p.grad
        fold = self._hora_fold[s.bucket]
        if grad is None:
            view.zero_()
        else:
            if fold:
                torch.mul(grad, fold, out=view)
            else:
                view.copy_(grad)
        s.scaled = bool(fold)
        p.grad = view

    def _hora_submit_bucket(self, b: int) -> None:
        """Start the reduction of bucket ``b``: its flat buffer as one tensor, or each
        gradient by name when the bucket has no flat buffer."""
        self._hora_submitted[b] = True
        self._hora_counted = True
        bucket = self._hora_buckets[b]
        if not self._hora_flat_ok[b]:
            for q in bucket:
                self._hora_handles[q] = self._hora_submit(q)
            return
        if self._hora_flats[b] is None:
            self._hora_make_flat(b)
        flat = self._hora_flats[b]
        slots = self._hora_bucket_slots[b]
        small = self._hora_small[b]
        views: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        for s in slots:  # gradients this rank did not compute, or replaced by the user
            if s.sparse:
                s.view.zero_()
                self._hora_handles[s.p] = self._hora_submit_sparse(s.p)
            elif s.p.grad is not s.view:
                if small and s.p.grad is not None:
                    views.append(s.view)
                    grads.append(s.p.grad)
                    s.p.grad = s.view
                else:
                    self._hora_adopt(s, s.view)
        if views:  # a small bucket: every gradient autograd made anew, in one batched copy
            torch._foreach_copy_(views, grads)
        if not self._hora_layout_checked:
            self._hora_check_layout()
        # named after its index and its first parameter (two optimizers over differently
        # named models do not collide, as with names per gradient)
        name = self._hora_bucket_names[b]
        if self._hora_room[b]:
            op = self._hora_op
            fold = self._hora_fold[b]
            if fold:  # every gradient of the bucket scaled by 1/size exactly once, then summed
                if small:  # none is scaled yet: the whole bucket at once
                    data, factor = self._hora_scale_by[b]
                    data.mul_(factor)
                else:
                    rest = [s.view for s in slots if not s.scaled]
                    if rest:  # accumulated in place by autograd (zero_grad(set_to_none=False))
                        torch._foreach_mul_(rest, fold)
                op = _hn.Sum
            self._hora_handles[b] = _ops.bucket_allreduce_async_(
                flat, self._hora_numel[b], op=op, name=name, postscale_factor=self._hora_postscale)
            return
        self._hora_handles[b] = self._hora_allreduce(flat[: self._hora_numel[b]], name)

    def _hora_check_layout(self) -> None:
        """Once, before the first flat bucket is reduced: every rank must pack the same
        parameters into the same buckets in the same order, since a flat bucket is
        matched across ranks as one tensor (a different order would add up gradients of
        different parameters without any error).

        Raises:
            ConfigError: naming the first bucket and parameter where a rank differs.
        """
        from hora.torch.functions import allgather_object

        mine = [
            [(self._hora_names[p], tuple(p.shape), str(p.dtype)) for p in bucket] if ok else None
            for bucket, ok in zip(self._hora_buckets, self._hora_flat_ok)
        ]
        ranks = sorted(self._hora_process_set.ranks or range(_hn.size()))
        layouts = allgather_object(mine, name="hora.optimizer.bucket_layout", process_set=self._hora_process_set)
        self._hora_layout_checked = True
        for i, theirs in enumerate(layouts):
            if theirs == mine:
                continue
            rank = ranks[i]
            for b in range(max(len(mine), len(theirs))):
                a = mine[b] if b < len(mine) else None
                o = theirs[b] if b < len(theirs) else None
                if a != o:
                    raise ConfigError(
                        f"DistributedOptimizer: gradient bucket {b} differs between this rank "
                        f"({_hn.rank()}) and rank {rank}: {first_difference(a, o)}. Every rank "
                        "must build the same model and register its parameters in the same order "
                        "(or pass gradient_as_bucket_view=False to match gradients by name)"
                    )

    def _hora_submit(self, p: torch.Tensor) -> Any:
        """Start the allreduce of ``p.grad`` (zeros when it has none)."""
        if self._hora_slots[p].sparse:
            return self._hora_submit_sparse(p)
        if p.grad is None:
            # This rank computed no gradient for p this step, another may have: reduce zeros.
            p.grad = torch.zeros_like(p, memory_format=torch.preserve_format)
        # The engine fuses ready gradients and applies the compressor to the fused buffer.
        return self._hora_allreduce(p.grad, _GRAD_PREFIX + self._hora_names[p])

    def _hora_submit_sparse(self, p: torch.Tensor) -> _SparseReduction:
        """Start reducing a sparse gradient: densified and allreduced with
        ``sparse_as_dense``, else by allgather of its indices and values (as Horovod).
        A rank without a gradient for ``p`` this step contributes an empty one."""
        from hora.torch.mpi_ops import sparse_allreduce_async

        grad = p.grad
        if grad is None:
            dense_dims = tuple(p.shape[1:])
            grad = torch.sparse_coo_tensor(torch.empty(1, 0, dtype=torch.long), torch.empty((0,) + dense_dims,
                                           dtype=p.dtype), tuple(p.shape), device=p.device)
        name = _GRAD_PREFIX + self._hora_names[p]
        if self._hora_sparse_as_dense:
            return _SparseReduction(p, self._hora_allreduce(grad.to_dense().contiguous(), name), dense=True)
        op = self._hora_op
        if op not in (_hn.Average, _hn.Sum):
            raise ConfigError(f"DistributedOptimizer(op={op!r}): the sparse gradient of {self._hora_names[p]!r} is "
                              "reduced with Average or Sum only (or pass sparse_as_dense=True)")
        return _SparseReduction(p, sparse_allreduce_async(grad.coalesce(), name, op, self._hora_process_set),
                                dense=False)

    def _hora_allreduce(self, tensor: torch.Tensor, name: str) -> Any:
        """The in-place allreduce of a gradient or a flat bucket, with this optimizer's
        op, scaling, process set and compression."""
        return _hn.allreduce_async_(
            tensor,
            op=self._hora_op,
            name=name,
            prescale_factor=self._hora_prescale,
            postscale_factor=self._hora_postscale,
            process_set=self._hora_process_set,
            compression=self._hora_compression,
        )

    # ---------------------------------------------------------------- public API
    def synchronize(self) -> None:
        """Wait until every gradient of this step is reduced and written to ``p.grad``.

        Parameters whose gradient was not submitted yet (no gradient on this rank, or
        fewer than ``backward_passes_per_step`` passes) are submitted now.

        Raises:
            CollectiveError: a reduction failed or ranks disagree about a gradient.
        """
        if not self._hora_participates():  # alone, or outside the process set: local step
            self._hora_synchronized = True
            return
        for b in range(len(self._hora_buckets)):
            if not self._hora_submitted[b]:
                self._hora_submit_bucket(b)
        try:
            for handle in self._hora_handles.values():
                handle.synchronize()  # in place: the result is already in p.grad (or its bucket)
        finally:
            self._hora_handles.clear()
            self._hora_reset_counts()
        self._hora_synchronized = True

    def _hora_reset_counts(self) -> None:
        self._hora_counted = False  # (set again by the next gradient hook or bucket submission)
        bpps = self._hora_bpps
        for s in self._hora_slots.values():
            s.delay = bpps
            s.scaled = False
        self._hora_bucket_ready = [0] * len(self._hora_buckets)
        self._hora_submitted = [False] * len(self._hora_buckets)

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Inside this block ``step()`` does not synchronize; use after an explicit
        ``synchronize()`` (e.g. to clip the reduced gradients before stepping)."""
        self._hora_should_sync = False
        try:
            yield
        finally:
            self._hora_should_sync = True

    def step(self, closure: Any = None) -> Any:
        """Wait for the gradients still in flight, then step the wrapped optimizer.

        With a ``closure`` (torch's protocol: it recomputes the loss and its gradients),
        the closure runs first, with gradients enabled, so that its gradients are the
        ones reduced; then the reduction is waited for and the wrapped optimizer steps
        without the closure. Returns the closure's loss. (Optimizers that evaluate the
        closure several times inside one step, as LBFGS does, cannot have every
        evaluation reduced and are not supported.)
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._hora_should_sync:
            if self._hora_synchronized:
                warnings.warn(  # Horovod's words (code written for it may look for them)
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to "
                    "consider using optimizer.skip_synchronize() context if you use "
                    "optimizer.synchronize() in your code.",
                    stacklevel=2,
                )
            self.synchronize()
        self._hora_synchronized = False
        super().step()  # type: ignore[misc]
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients. Reductions still in flight are completed first (every rank
        takes part, so none is left waiting) and their results discarded."""
        if self._hora_handles:
            log.warning(
                "optimizer.zero_grad() called while %d gradient reductions were in flight "
                "(after backward, before step/synchronize); completing and discarding them",
                len(self._hora_handles),
            )
            self.synchronize()
            self._hora_synchronized = False
        if self._hora_counted:  # (step() has already reset them after its synchronize)
            self._hora_reset_counts()
        super().zero_grad(set_to_none=set_to_none)  # type: ignore[misc]

    def remove_hooks(self) -> None:
        """Unregister the gradient hooks (the optimizer then no longer reduces)."""
        for h in self._hora_hooks:
            h.remove()
        self._hora_hooks.clear()

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change ``backward_passes_per_step`` (Horovod's method); takes effect at the next step.

        Raises:
            ConfigError: ``passes`` is not an integer >= 1.
        """
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ConfigError(f"backward_passes_per_step must be an integer >= 1, got {passes!r}")
        self._hora_bpps = passes
        self.backward_passes_per_step = passes
        self._hora_reset_counts()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the wrapped optimizer's state; the step in progress is forgotten (as Horovod)."""
        self._hora_forget_step()
        super().load_state_dict(state_dict)  # type: ignore[misc]

    def _hora_forget_step(self) -> None:
        """Drop what the current step has submitted (after an elastic restore: the engine
        that ran those reductions is gone)."""
        self._hora_handles.clear()
        self._hora_synchronized = False
        self._hora_reset_counts()

    def _hora_forget_world(self) -> None:
        """After an elastic reset into a job of other ranks (another size): drop the step
        in flight and what was sized for the old job (the flat buckets' spare room, the
        1/size folded into them, whether this rank reduces, the checked layout); all of it
        is rebuilt from the new job at the next gradients."""
        self._hora_forget_step()
        for s in self._hora_slots.values():
            s.view = None
        self._hora_flats = [None] * len(self._hora_buckets)
        self._hora_room = [False] * len(self._hora_buckets)
        self._hora_fold = [0.0] * len(self._hora_buckets)
        self._hora_scale_by = [None] * len(self._hora_buckets)
        self._hora_member = None
        self._hora_layout_checked = not any(self._hora_flat_ok)


__all__ = ["DistributedMixin", "ENV_BUCKET_CAP_MB", "DEFAULT_BUCKET_CAP_MB", "FIRST_BUCKET_BYTES", "SMALL_BUCKET_BYTES"]
