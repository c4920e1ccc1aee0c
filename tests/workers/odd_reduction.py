"""Worker: odd bucket sizes and compressions given to the optimizer, the tape and ``allreduce``.

Each try prints ``RESULT {"rank": 0, "case": ..., "error": class name or null, "says": message}``: one
process, so that every case costs one TensorFlow (or JAX) start, not one each. On the JAX backend
only the optimizer and ``allreduce`` are tried (the tape is TensorFlow's).
"""

from __future__ import annotations

import json
import os

import keras

import mldist

ctx = mldist.init()
ON_JAX = os.environ.get("KERAS_BACKEND") == "jax"
ODD: list[object] = ["abc", None, 0, -1, True, 2.5]
CASES: list[tuple[str, dict[str, object]]] = [(f"bucket_bytes={v!r}", {"bucket_bytes": v}) for v in ODD]
CASES += [("compression='bf16'", {"compression": "bf16"}), ("compression='fp16'", {"compression": "fp16"})]
CASES += [("bucket_bytes=1024", {"bucket_bytes": 1024})]


def optimizer(kwargs: dict[str, object]) -> None:
    mldist.keras.DistributedOptimizer(keras.optimizers.SGD(0.1), **kwargs)  # type: ignore[arg-type]


def tape(kwargs: dict[str, object]) -> None:
    import tensorflow as tf

    with tf.GradientTape() as recorded:
        pass
    mldist.DistributedGradientTape(recorded, **kwargs)  # type: ignore[arg-type]


def allreduce(kwargs: dict[str, object]) -> None:
    mldist.allreduce([keras.ops.ones([3])], **kwargs)  # type: ignore[arg-type]


USERS = (
    {"optimizer": optimizer, "allreduce": allreduce}
    if ON_JAX
    else {"optimizer": optimizer, "tape": tape, "allreduce": allreduce}
)
for user, call in USERS.items():
    for case, kwargs in CASES:
        try:
            call(kwargs)
            error, says = None, ""
        except Exception as exc:  # the class is what the test reads
            error, says = type(exc).__name__, str(exc)
        print(
            "RESULT",
            json.dumps({"rank": ctx.rank, "user": user, "case": case, "error": error, "says": says}),
            flush=True,
        )
