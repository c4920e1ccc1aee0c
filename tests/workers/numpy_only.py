"""Worker: a numpy-only script (no TensorFlow, no JAX) calling mldist's collectives; prints RESULT json.

The row: the results' types and values, and whether TensorFlow, Keras or JAX got imported.
"""

import json
import sys

import numpy as np

import mldist

ctx = mldist.init()
r = ctx.rank
summed = mldist.allreduce(np.arange(3.0) + r, op="sum")
nested = mldist.allreduce({"a": np.float32(r), "b": [np.full((2, 2), r + 1, np.float16)]})
biggest = mldist.allreduce(r + 5, op="max")
both = mldist.allreduce(np.array([r == 0, True]), op="min")
sent = mldist.broadcast((np.arange(4) * (r + 1), 7.5 * (r + 1)), root=ctx.size - 1)
rows = mldist.allgather(np.full((r + 1, 2), r, np.int32))
row = {
    "rank": r,
    "size": ctx.size,
    "engine": ctx.communication,
    "types": [type(v).__name__ for v in (summed, nested["a"], nested["b"][0], biggest, both, sent[0], sent[1], rows)],
    "dtypes": [str(v.dtype) for v in (summed, nested["a"], nested["b"][0], both, sent[0], rows)],
    "sum": summed.tolist(),
    "mean": [float(nested["a"]), nested["b"][0].tolist()],
    "max": biggest,
    "min": both.tolist(),
    "bcast": [sent[0].tolist(), sent[1]],
    "gather": rows.tolist(),
    "imported": sorted(m for m in ("tensorflow", "keras", "jax", "ml_dtypes") if m in sys.modules),
}
print("RESULT " + json.dumps(row), flush=True)
