"""``horovod.tensorflow.compression``'s path: Horovod's compressors."""

from ..compression import BF16Compressor, Compression, Compressor, FP16Compressor, NoneCompressor

__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
