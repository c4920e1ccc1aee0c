"""Horovod's gradient compressors: ``Compression.none`` and ``Compression.fp16``; mldist adds ``Compression.bf16``.

A compressor has ``compress(tensor) -> (tensor, ctx)`` and
``decompress(tensor, ctx) -> tensor``; user-written ones with the same two
static methods work everywhere a ``compression=`` argument is taken.

Example::

    tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16)
"""

from __future__ import annotations

from typing import Any


class Compressor:
    """Interface: how a tensor travels and how it is restored."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """The tensor to send, and what ``decompress`` needs to restore it."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """The received tensor, restored."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Send tensors as they are."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class _CastCompressor(Compressor):
    """Send float32/float64 tensors as :attr:`wire` (a TensorFlow dtype's name); other dtypes as they are."""

    wire = "float16"

    @classmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:  # type: ignore[override]
        import tensorflow as tf

        if tensor.dtype in (tf.float32, tf.float64):
            return tf.cast(tensor, getattr(tf, cls.wire)), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        import tensorflow as tf

        return tensor if ctx is None else tf.cast(tensor, ctx)


class FP16Compressor(_CastCompressor):
    """Send float32/float64 tensors as float16 (half the bytes); other dtypes as they are."""

    wire = "float16"


class BF16Compressor(_CastCompressor):
    """Send float32/float64 tensors as bfloat16 (half the bytes, float32's range); other dtypes as they are."""

    wire = "bfloat16"


class Compression:
    """The compressors by Horovod's names (``bf16`` is mldist's)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
