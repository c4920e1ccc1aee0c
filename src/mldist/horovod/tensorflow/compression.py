"""``horovod.tensorflow.compression``'s path: Horovod's compressors."""

from ..compression import Compression, Compressor, FP16Compressor, NoneCompressor

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
