"""Legacy Keras 2 (tf_keras) worker. TF_USE_LEGACY_KERAS=1 must be set before TF loads.

Each rank trains on different data in two ways and prints RESULT with weight checksums:
  scope      with mldist.strategy().scope(): model.fit (MultiWorkerMirroredStrategy)
  optimizer  model outside any scope, mldist.keras.DistributedOptimizer(tf.keras SGD)
  plain      the same without mldist (a control: must differ between ranks)
"""

from __future__ import annotations

import hashlib
import json
import os

assert os.environ.get("TF_USE_LEGACY_KERAS") == "1", "set TF_USE_LEGACY_KERAS=1 before starting"

import mldist  # noqa: E402
import mldist.keras  # noqa: E402

ctx = mldist.init()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tf.keras
rng = np.random.default_rng(ctx.rank)  # different data on every rank
x = rng.normal(size=(64, 4)).astype("float32")
y = rng.normal(size=(64, 1)).astype("float32")


def model() -> object:
    return keras.Sequential([keras.layers.Dense(8, activation="relu", input_shape=(4,)), keras.layers.Dense(1)])


def digest(m: object) -> str:
    return hashlib.sha256(b"".join(w.tobytes() for w in m.get_weights())).hexdigest()[:16]  # type: ignore[attr-defined]


out = {"rank": ctx.rank, "keras": keras.__name__}
keras.utils.set_random_seed(0)  # same start on every rank (no Keras 3 callbacks here)
with mldist.strategy().scope():
    m1 = model()
    m1.compile(keras.optimizers.SGD(0.05), "mse")
m1.fit(x, y, batch_size=16 * ctx.size, epochs=2, verbose=0)
out["scope"] = digest(m1)

keras.utils.set_random_seed(0)  # same start on every rank (no Keras 3 callbacks here)
m2 = model()
m2.compile(mldist.keras.DistributedOptimizer(keras.optimizers.SGD(0.05)), "mse")
m2.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
out["optimizer"] = digest(m2)
out["optimizer_class"] = type(m2.optimizer).__module__

keras.utils.set_random_seed(0)  # control: without mldist the ranks must drift apart
m3 = model()
m3.compile(keras.optimizers.SGD(0.05), "mse")
m3.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
out["plain"] = digest(m3)
print("RESULT " + json.dumps(out), flush=True)
