"""``SyncBatchNorm``: batch normalization with statistics over the global batch.

In training mode each rank computes, per channel, the count, mean and sum of squared
deviations (M2) of its local batch; one allgather of those ``2C+1`` numbers gives every
rank the global mean and variance (combined with Chan's parallel formula, which does not
lose precision the way ``E[x^2] - E[x]^2`` can). Backward allreduces the two per-channel
sums the input gradient depends on, so ``dx`` equals what one process would compute on
the whole batch. Parameter gradients stay local (``DistributedOptimizer`` reduces them).
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

import hora.native as _hn
from hora.errors import ConfigError

log = logging.getLogger(__name__)

_instances = itertools.count()


def _reduce_dims(x: torch.Tensor) -> list[int]:
    return [0] + list(range(2, x.dim()))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
        eps: float,
        momentum: float,
        process_set: Any,
        name: str,
    ) -> torch.Tensor:
        c = x.shape[1]
        dims = _reduce_dims(x)
        n_local = x.numel() // c if c else 0
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        xa = x.to(acc)
        stats = torch.zeros(1, 2 * c + 1, dtype=acc, device=x.device)
        if n_local > 0:
            var_l, mean_l = torch.var_mean(xa, dim=dims, correction=0)
            stats[0, 0] = n_local
            stats[0, 1 : c + 1] = mean_l
            stats[0, c + 1 :] = var_l * n_local
        gathered = _hn.allgather(stats, name=f"{name}.forward", process_set=process_set)
        counts = gathered[:, 0:1]
        means = gathered[:, 1 : c + 1]
        m2s = gathered[:, c + 1 :]
        n = counts.sum()
        if n.item() < 1:
            raise ConfigError(f"SyncBatchNorm {name}: the global batch is empty on every rank")
        mean = (counts * means).sum(0) / n
        m2 = (m2s + counts * (means - mean) ** 2).sum(0)
        var = m2 / n
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                unbiased = m2 / (n - 1) if n.item() > 1 else var
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        shape = [1, c] + [1] * (x.dim() - 2)
        xhat = (xa - mean.view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.to(acc).view(shape)
        if bias is not None:
            y = y + bias.to(acc).view(shape)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.n = n.item()
        ctx.has_bias = bias is not None
        ctx.process_set = process_set
        ctx.name = name
        ctx.in_dtype = x.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        xhat, invstd, weight = ctx.saved_tensors
        c = xhat.shape[1]
        dims = _reduce_dims(xhat)
        shape = [1, c] + [1] * (xhat.dim() - 2)
        dy = grad_out.to(xhat.dtype)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        grad_weight = sum_dy_xhat.to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        grad_bias = sum_dy.to(weight.dtype if weight is not None else ctx.in_dtype) \
            if ctx.has_bias and ctx.needs_input_grad[2] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            both = torch.cat([sum_dy, sum_dy_xhat])
            both = _hn.allreduce(both, op=_hn.Sum, name=f"{ctx.name}.backward", process_set=ctx.process_set)
            g_sum_dy, g_sum_dy_xhat = both[:c], both[c:]
            scale = invstd if weight is None else invstd * weight.to(xhat.dtype)
            grad_x = scale.view(shape) * (
                dy - (g_sum_dy / ctx.n).view(shape) - xhat * (g_sum_dy_xhat / ctx.n).view(shape)
            )
            grad_x = grad_x.to(ctx.in_dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization whose training-mode statistics span every rank's batch.

    A drop-in for ``torch.nn.BatchNorm1d/2d/3d`` (input ``(N, C, *)``). With ``k`` ranks
    each holding ``N/k`` samples, outputs, running statistics and input gradients
    equal those of one ``BatchNorm`` on the concatenated batch. In eval mode it uses
    the running statistics and communicates nothing. Every rank must call it the same
    number of times, in the same order (it runs a collective in forward and backward).

    Args:
        num_features, eps, momentum, affine, track_running_stats: as ``BatchNorm``.
        process_set: the ranks whose batches form the global batch (default: all).
        name: the collective name prefix (default: assigned in construction order,
            identical on every rank that builds the same model).
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_set: Any = None,
        name: str | None = None,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_set = process_set
        self._hora_name = name or f"sync_batch_norm.{next(_instances)}"

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ConfigError(f"SyncBatchNorm expects input of shape (N, C, *), got {input.dim()}-D input")
        if input.shape[1] != self.num_features:
            raise ConfigError(
                f"SyncBatchNorm({self.num_features}) got input with {input.shape[1]} channels (dim 1)"
            )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        if not use_batch_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                False, factor, self.eps)
        ps = _hn.global_process_set if self.process_set is None else self.process_set
        running_mean = self.running_mean if self.training else None
        running_var = self.running_var if self.training else None
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, running_mean, running_var, self.eps, factor, ps, self._hora_name
        )

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module, process_set: Any = None) -> torch.nn.Module:
        """Return ``module`` with every ``BatchNorm*d`` replaced by a ``SyncBatchNorm``
        holding the same parameters and running statistics."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, process_set=process_set)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
        for child_name, child in module.named_children():
            out.add_module(child_name, cls.convert_sync_batchnorm(child, process_set))
        return out
