"""Gradient compression applied around a (fused) allreduce.

``Compression.fp16`` and ``Compression.bf16`` cast floating-point tensors to a 16-bit
type before they go on the wire and back afterwards; integer tensors pass unchanged.
The engine applies the compressor to the *fused* buffer, so one cast covers many
tensors. ``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor, ctx)`` follow
Horovod's interface, so custom compressors written for it work here.
"""

from __future__ import annotations

from typing import Any

import torch

from hora.errors import ConfigError


class Compressor:
    """Interface: a compressor is a class with static ``compress``/``decompress``."""

    name = "none"
    wire_dtype: torch.dtype | None = None

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class NoneCompressor(Compressor):
    """No compression."""

    name = "none"


class _CastCompressor(Compressor):
    wire_dtype: torch.dtype = torch.float16

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:  # type: ignore[override]
        if tensor.is_floating_point() and tensor.dtype != cls.wire_dtype:
            return tensor.to(cls.wire_dtype), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor: torch.Tensor, ctx: Any) -> torch.Tensor:  # type: ignore[override]
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Cast floating-point tensors to float16 on the wire."""

    name = "fp16"
    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Cast floating-point tensors to bfloat16 on the wire."""

    name = "bf16"
    wire_dtype = torch.bfloat16


class Compression:
    """The available compressors: ``Compression.none``, ``.fp16``, ``.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


# module-level aliases: hora.native.compression.fp16 reads like Compression.fp16
none = NoneCompressor
fp16 = FP16Compressor
bf16 = BF16Compressor

_BY_NAME = {"none": NoneCompressor, "fp16": FP16Compressor, "bf16": BF16Compressor}


def resolve(compression: Any) -> type[Compressor]:
    """Map ``None``, a name or a compressor class to a compressor class.

    Raises:
        ConfigError: an unknown name or an object without compress/decompress.
    """
    if compression is None:
        return NoneCompressor
    if isinstance(compression, str):
        try:
            return _BY_NAME[compression.lower()]
        except KeyError:
            raise ConfigError(f"compression={compression!r} is unknown; use one of {sorted(_BY_NAME)}") from None
    if hasattr(compression, "compress") and hasattr(compression, "decompress"):
        return compression
    raise ConfigError(f"compression={compression!r} has no compress/decompress methods")


def name_of(compressor: Any) -> str:
    """A stable name for a compressor (used to match requests across ranks)."""
    return getattr(compressor, "name", None) or f"{compressor.__module__}.{compressor.__qualname__}"


__all__ = ["none", "fp16", "bf16", "Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "resolve", "name_of"]
