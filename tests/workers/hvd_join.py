"""hvd.join as a Horovod user writes it, on 2 ranks with uneven data (MPI engine).

1. A training loop where rank 0 has 2 batches and rank 1 has 4: after its last batch a rank
   joins; rank 1's last two steps average its gradient with rank 0's zeros.
2. Horovod's own join test: rank 0 joins first, rank 1's average is tensor * (size - 1) / size.
3. A broadcast while rank 0 has joined fails on rank 1, which then joins.
4. Keras fit with 2 batches on rank 0 and 4 on rank 1, then join.
Prints RESULT {rank, loop_w, loop_last, average, average_bf16, broadcast_failed, fit_last}.
"""

from __future__ import annotations

import json

import numpy as np
import tensorflow as tf

import mldist.horovod as hvd
import mldist.horovod.tensorflow.keras as hvd_keras

hvd.init()
r = hvd.rank()
result: dict[str, object] = {"rank": r}

w = tf.Variable(1.0)
x = 1.0 if r == 0 else 3.0
for _ in range(2 if r == 0 else 4):
    with tf.GradientTape() as tape:
        loss = w * x
    (grad,) = hvd.DistributedGradientTape(tape).gradient(loss, [w])
    w.assign_sub(grad)  # SGD, learning rate 1
result["loop_last"] = int(hvd.join())
result["loop_w"] = float(w.numpy())

tensor = tf.constant([2.0, 4.0])
if r == 0:
    hvd.join()
else:
    result["average"] = hvd.allreduce(tensor).numpy().tolist()
    # Sent as 16 bits with their own MPI sum: the joined rank must answer with the same operation.
    result["average_bf16"] = hvd.allreduce(tensor, compression=hvd.Compression.bf16).numpy().tolist()
    hvd.join()

if r == 0:
    hvd.join()
else:
    try:
        hvd.broadcast(tensor, root_rank=1)
        result["broadcast_failed"] = False
    except tf.errors.FailedPreconditionError:
        result["broadcast_failed"] = True
    hvd.join()

keras = tf.keras
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="ones")])
model.compile(hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
rng = np.random.default_rng(r)
batches = 2 if r == 0 else 4
model.fit(rng.random((8 * batches, 2)), rng.random((8 * batches, 1)), batch_size=8, epochs=1, verbose=0)
result["fit_last"] = int(hvd_keras.join())
print("RESULT " + json.dumps(result), flush=True)
