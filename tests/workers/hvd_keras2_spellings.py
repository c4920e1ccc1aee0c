"""Worker: a Horovod TF2 script in Keras 2's spellings, on Keras 3. Usage: hvd_keras2_spellings.py alias|own.

``alias`` (run through ``python -m mldist.horovod.alias``), written as Horovod's TF2 examples are:
Keras's own optimizer in a ``@tf.function`` step with hvd.DistributedGradientTape that broadcasts
``opt.variables()`` after the first step (Keras 2's method; a list property in Keras 3), then a model
compiled with ``experimental_run_tf_function=False`` (a flag Keras 3 refuses) on hvd.DistributedOptimizer
and fit with BroadcastGlobalVariablesCallback. Each rank starts from its own weights and data.

``own`` (plain ``python``, ``import mldist.horovod``): the optimizer mldist hands out answers both
spellings by itself, and Keras's own optimizer is left as Keras made it (no alias, no patch).

Every rank prints one ``RESULT {json}`` line: the sha256 of its weights (and of its optimizer's
variables) after each part, and what ``opt.variables`` was.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import numpy as np
import tensorflow as tf

MODE = sys.argv[1]
if MODE == "alias":
    import horovod.tensorflow as hvd
    import horovod.tensorflow.keras as hvd_keras
else:
    import mldist.horovod as hvd
    import mldist.horovod.keras as hvd_keras

hvd.init()
tf.keras.utils.set_random_seed(hvd.rank())  # each rank its own weights and data: only the broadcast makes them one
layers = tf.keras.layers


def small_model() -> Any:
    return tf.keras.Sequential([tf.keras.Input((8,)), layers.Dense(16, activation="relu"), layers.Dense(4)])


def digest(arrays: Any) -> str:
    found = hashlib.sha256()
    for value in arrays:
        found.update(np.asarray(value).tobytes())
    return found.hexdigest()[:16]


x = tf.random.normal((32, 8))
y = tf.random.normal((32, 4))
result: dict[str, Any] = {"rank": hvd.rank(), "size": hvd.size()}

if MODE == "alias":
    model = small_model()
    opt = tf.optimizers.SGD(0.05, momentum=0.9)  # Keras's own: its momentum slots are variables to broadcast

    @tf.function
    def train_step(first_batch: bool) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
        return loss

    train_step(True)
    for _ in range(3):
        train_step(False)
    result["tape"] = digest(model.get_weights())
    result["tape_optimizer"] = digest([v.numpy() for v in opt.variables()])
    result["tape_variables_is_list"] = isinstance(opt.variables, list) and opt.variables() == opt.variables

    fitted = small_model()
    wrapped = hvd_keras.DistributedOptimizer(tf.optimizers.Adam(0.01), backward_passes_per_step=1)
    fitted.compile(loss="mse", optimizer=wrapped, experimental_run_tf_function=False)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    fitted.fit(data, epochs=2, verbose=0, callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
    result["fit"] = digest(fitted.get_weights())
    result["fit_optimizer"] = digest([v.numpy() for v in wrapped.variables()])
else:
    model = small_model()
    wrapped = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9))
    model.compile(loss="mse", optimizer=wrapped)
    model.fit(
        x, y, batch_size=8, epochs=1, verbose=0, callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)]
    )
    called = wrapped.variables()
    result["own_called"] = [v.path for v in called] == [v.path for v in wrapped.variables]
    result["own_count"] = len(called)
    result["keras_own_callable"] = callable(tf.keras.optimizers.SGD(0.1).variables)  # Keras's, untouched
    result["fit"] = digest(model.get_weights())

print("RESULT " + json.dumps(result), flush=True)
