"""Worker: mldist.init with the thread and placement knobs given as JSON in argv[1]; prints RESULT json."""

from __future__ import annotations

import json
import sys

import mldist

ctx = mldist.init(**json.loads(sys.argv[1] if len(sys.argv) > 1 else "{}"))

import tensorflow as tf  # noqa: E402

print(
    "RESULT",
    json.dumps(
        {
            "rank": ctx.rank,
            "intra": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter": tf.config.threading.get_inter_op_parallelism_threads(),
            "soft": tf.config.get_soft_device_placement(),
            "overrides": ctx.threads.overrides,
            "cpus": ctx.threads.cpus,
        }
    ),
    flush=True,
)
