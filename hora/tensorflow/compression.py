"""Gradient compression for TensorFlow tensors (Horovod's ``horovod.tensorflow.compression``).

``Compression.fp16`` / ``Compression.bf16`` cast floating-point tensors to a 16-bit type
for the wire and back afterwards; other dtypes pass unchanged. Their ``compress`` and
``decompress`` take TensorFlow tensors, as Horovod's do. When one of these built-in
compressors is passed to :func:`hora.tensorflow.allreduce`, the cast is done by the
engine on the fused buffer (``native`` names the engine's compressor); a compressor of
your own (any class with static ``compress(tensor) -> (tensor, ctx)`` and
``decompress(tensor, ctx) -> tensor``) is applied to each tensor around the allreduce,
as Horovod applies it. hora.native's torch-side compressors are accepted too.
"""

from __future__ import annotations

from typing import Any


def _tf():
    import tensorflow as tf

    return tf


class Compressor:
    """Interface: static ``compress``/``decompress`` on TensorFlow tensors."""

    native = "none"

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """Returns the tensor to send and a context for :meth:`decompress`."""
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """Returns the tensor as the caller gave it."""
        return tensor


class NoneCompressor(Compressor):
    """No compression."""

    native = "none"


class _CastCompressor(Compressor):
    wire = "float16"

    @classmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:  # type: ignore[override]
        tf = _tf()
        wire = tf.as_dtype(cls.wire)
        if tensor.dtype.is_floating and tensor.dtype != wire:
            return tf.cast(tensor, wire), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:  # type: ignore[override]
        return tensor if ctx is None else _tf().cast(tensor, ctx)


class FP16Compressor(_CastCompressor):
    """Cast floating-point tensors to float16 on the wire."""

    native = "fp16"
    wire = "float16"


class BF16Compressor(_CastCompressor):
    """Cast floating-point tensors to bfloat16 on the wire."""

    native = "bf16"
    wire = "bfloat16"


class Compression:
    """The available compressors: ``Compression.none``, ``.fp16``, ``.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def split(compression: Any) -> tuple[Any, Any]:
    """``(engine_compressor, framework_compressor)`` for a ``compression=`` argument.

    hora's built-in compressors (these, or hora.native's) run in the engine, on the
    fused buffer; anything else with ``compress``/``decompress`` runs on each tensor in
    TensorFlow. Exactly one of the two is not ``None`` (both ``None`` for no compression).

    Raises:
        ConfigError: ``compression`` has no ``compress``/``decompress``.
    """
    from hora.errors import ConfigError
    from hora.native import compression as native

    if compression is None or compression is NoneCompressor:
        return None, None
    name = getattr(compression, "native", None)
    if isinstance(name, str):
        return (None if name == "none" else name), None
    if isinstance(compression, str) or (isinstance(compression, type) and issubclass(compression, native.Compressor)):
        return native.resolve(compression), None
    if hasattr(compression, "compress") and hasattr(compression, "decompress"):
        return None, compression
    raise ConfigError(f"compression={compression!r} has no compress/decompress methods")


__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "split"]
