"""How :func:`hora.torch.DistributedOptimizer` groups gradients: its checked options, the buckets
(DDP's rule) and which gradients can be views of a bucket's flat buffer."""

from __future__ import annotations

from typing import Any

import torch

import hora.native as _hn
from hora.errors import ConfigError

# as DDP: the first bucket is small, so its reduction starts early (for GPU parameters; see
# first_bucket_mb for why CPU parameters get none)
FIRST_BUCKET_BYTES = 1024 * 1024
SMALL_BUCKET_BYTES = 256 * 1024  # gradients of a bucket up to this size are adopted together at submit


def resolve_compression(compression: Any) -> Any:
    """``None``/name/compressor -> compressor. Raises ConfigError for anything else."""
    from hora.native.compression import resolve

    return resolve(compression)


def viewable(p: torch.Tensor) -> bool:
    """Whether ``p``'s gradient can be a view of a flat bucket: dense and contiguous
    (a channels-last weight keeps a gradient of its own layout)."""
    return p.layout == torch.strided and p.is_contiguous()


def plan_buckets(params: list[torch.Tensor], cap_bytes: float, first_bytes: float, by_layout: bool,
                 ) -> list[list[torch.Tensor]]:
    """``params`` in buckets, DDP style: consecutive parameters in reverse registration order
    (roughly the order backward produces their gradients), the first bucket up to
    ``first_bytes``, the others up to ``cap_bytes``; ``by_layout``: a bucket holds parameters of
    one dtype, device and viewability only (it owns one flat buffer their ``.grad`` are views of)."""
    buckets: list[list[torch.Tensor]] = []
    size = cap_bytes + 1  # force a new bucket first
    key: Any = None
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        limit = min(cap_bytes, first_bytes) if len(buckets) <= 1 else cap_bytes
        p_key = (p.dtype, p.device, viewable(p)) if by_layout else None
        if not buckets or size + nbytes > limit or p_key != key:
            buckets.append([])
            size = 0
            key = p_key
        buckets[-1].append(p)
        size += nbytes
    return buckets


def checked_options(backward_passes_per_step: Any, op: Any, gradient_predivide_factor: Any, compression: Any,
                     bucket_cap_mb: Any, first_bucket_mb: Any, gradient_as_bucket_view: Any,
                     ) -> tuple[float, Any, float, float | None]:
    """``(predivide factor, compressor, bucket cap bytes, first bucket bytes or None)`` of
    :func:`~hora.torch.DistributedOptimizer`'s arguments.

    Raises:
        ConfigError: any of them out of its range (the message names it and the value).
    """
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
            or backward_passes_per_step < 1:
        raise ConfigError(
            f"backward_passes_per_step must be an integer >= 1, got {backward_passes_per_step!r}"
        )
    if not isinstance(op, _hn.ReduceOp):
        raise ConfigError(f"op must be a hora ReduceOp (Sum, Average, ...), got {op!r}")
    try:
        factor = float(gradient_predivide_factor)
    except (TypeError, ValueError):
        raise ConfigError(
            f"gradient_predivide_factor must be a number > 0, got {gradient_predivide_factor!r}"
        ) from None
    if not factor > 0:
        raise ConfigError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor!r}")
    if factor != 1.0 and op != _hn.Average:
        raise ConfigError(
            f"gradient_predivide_factor={factor} only applies to op=Average, got op={op!r}"
        )
    compression = resolve_compression(compression)
    try:
        cap_bytes = float(bucket_cap_mb) * 1024 * 1024
    except (TypeError, ValueError):
        raise ConfigError(f"bucket_cap_mb must be a number >= 0, got {bucket_cap_mb!r}") from None
    if not cap_bytes >= 0:
        raise ConfigError(f"bucket_cap_mb must be a number >= 0, got {bucket_cap_mb!r}")
    first_bytes: float | None = None
    if first_bucket_mb is not None:
        try:
            first_bytes = float(first_bucket_mb) * 1024 * 1024
        except (TypeError, ValueError):
            raise ConfigError(f"first_bucket_mb must be a number > 0, got {first_bucket_mb!r}") from None
        if not first_bytes > 0:
            raise ConfigError(f"first_bucket_mb must be a number > 0, got {first_bucket_mb!r}")
    if not isinstance(gradient_as_bucket_view, bool):
        raise ConfigError(f"gradient_as_bucket_view must be True or False, got {gradient_as_bucket_view!r}")
    return factor, compression, cap_bytes, first_bytes


__all__ = ["FIRST_BUCKET_BYTES", "SMALL_BUCKET_BYTES", "checked_options", "plan_buckets", "resolve_compression",
           "viewable"]
