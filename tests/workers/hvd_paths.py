"""Horovod's module paths through the import alias (run with python -m mldist.horovod.alias): one process.

Prints one "NAME value" line per check; the test compares them.
"""

from __future__ import annotations

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
import tensorflow as tf
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.tensorflow.compression import Compression, FP16Compressor
from horovod.tensorflow.functions import allgather_object, broadcast_object
from horovod.tensorflow.mpi_ops import Sum, _allreduce, allgather, rank
from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization
from horovod.tensorflow.util import _cache, _executing_eagerly, refs_to_vars, vars_to_refs

hvd.init()
print("EAGER", _executing_eagerly(), tf.function(lambda: tf.constant(_executing_eagerly()))().numpy())
print("FP16", Compression.fp16 is FP16Compressor)
print("SUM", _allreduce(tf.constant([1.5]), op=Sum).numpy().tolist(), rank(), allgather(tf.ones([1, 2])).shape)
print("OBJECTS", broadcast_object({"a": 1}), allgather_object("x"))
print("SYNCBN", hvd.SyncBatchNormalization is SyncBatchNormalization is hvd_keras.SyncBatchNormalization)
v = tf.Variable(1.0)
print("REFS", refs_to_vars(vars_to_refs([v, [v]]))[1][0] is v, _cache(lambda a: [a])(1) is _cache(lambda a: [a])(1))
print("EXCEPTIONS", issubclass(HorovodInternalError, RuntimeError), HostsUpdatedInterrupt(True).skip_sync)
for module in ("horovod.torch", "horovod.tensorflow.nosuch"):
    try:
        __import__(module)
    except ImportError as exc:
        print("MISSING", module, type(exc).__name__)
    except NotImplementedError as exc:
        print("MISSING", module, str(exc).split(": ", 1)[1][:40])
import horovod.tensorflow.elastic as elastic  # noqa: E402
import horovod.tensorflow.keras.elastic as keras_elastic  # noqa: E402

print("ELASTIC", elastic.run is keras_elastic.run, keras_elastic.KerasState is elastic.TensorFlowKerasState)
print("ELASTIC_ATTR", hvd_keras.elastic is keras_elastic, hvd.elastic is elastic)
