"""Process sets as a Horovod user writes them, on 3 ranks (MPI engine): {0, 2} registered at init,
{1} added later; collectives, objects, a tf.function and a tape inside a set, the error outside it.
Prints RESULT {rank, ...}.
"""

from __future__ import annotations

import json

import tensorflow as tf

import mldist.horovod as hvd

evens = hvd.ProcessSet([0, 2])
hvd.init(process_sets=[evens])
odds = hvd.add_process_set([1])
r = hvd.rank()
out: dict[str, object] = {"rank": r, "ids": [evens.process_set_id, odds.process_set_id]}
if evens.included():
    out["sum"] = hvd.allreduce(tf.constant([r + 1.0]), op=hvd.Sum, process_set=evens).numpy().tolist()
    out["average"] = hvd.allreduce(tf.constant([r + 1.0]), process_set=evens).numpy().tolist()
    out["gather"] = hvd.allgather(tf.constant([[r]]), process_set=evens).numpy().tolist()
    out["bcast"] = hvd.broadcast(tf.constant([r]), root_rank=2, process_set=evens).numpy().tolist()
    out["object"] = hvd.broadcast_object({"from": r}, root_rank=2, process_set=evens)
    out["set"] = [evens.size(), evens.rank(), int(hvd.size_op(evens.process_set_id))]
    traced = tf.function(lambda v: hvd.allreduce(v, op=hvd.Sum, process_set=evens))
    out["traced"] = traced(tf.constant([1.0])).numpy().tolist()
    w = tf.Variable([float(r)])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * (r + 1.0))
    out["tape"] = hvd.DistributedGradientTape(tape, process_set=evens).gradient(loss, [w])[0].numpy().tolist()
else:
    try:
        hvd.allreduce(tf.ones([1]), process_set=evens)
        out["outside"] = "no error"
    except ValueError as exc:
        out["outside"] = str(exc)
    out["alone"] = hvd.allreduce(tf.constant([5.0]), op=hvd.Sum, process_set=odds).numpy().tolist()
out["world"] = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum).numpy().tolist()  # every rank again
out["removed"] = [hvd.remove_process_set(odds), hvd.remove_process_set(odds)]
print("RESULT " + json.dumps(out), flush=True)
