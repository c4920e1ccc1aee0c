"""Worker: mldist's collectives on KERAS_BACKEND=jax print one ``RESULT {json}`` line per rank.

Run with KERAS_BACKEND=jax under ``mldist run -n 2`` (or alone: every collective is an identity).
"""

from __future__ import annotations

import json

import numpy as np

import mldist
import mldist.errors

ctx = mldist.init()
r = ctx.rank
out: dict[str, object] = {"rank": r, "backend": ctx.backend, "engine": ctx.communication}
summed = mldist.allreduce([np.array([1.0, r]), np.array([r + 1], np.int64)], op="sum")
out["sum"] = [a.tolist() for a in summed]
out["mean"] = mldist.allreduce(np.array([2.0 * r], np.float32), op="mean").tolist()
out["max"] = mldist.allreduce(np.array([r, -r]), op="max").tolist()
out["big_int"] = int(mldist.allreduce(np.array(2**40 + r, np.int64), op="sum"))  # 64 bits stay exact
out["bcast"] = mldist.broadcast({"a": np.arange(3) * (r + 1), "s": np.array(r, np.int32)}, root=ctx.size - 1)
out["bcast"] = {k: np.asarray(v).tolist() for k, v in out["bcast"].items()}  # type: ignore[attr-defined]
out["gather"] = mldist.allgather(np.full((r + 1, 2), r)).tolist()
try:
    mldist.allreduce(np.zeros(r + 1), op="sum")
    out["mismatch"] = "none"
except mldist.errors.CollectiveMismatch as exc:
    out["mismatch"] = str(exc).split(":")[0]
# TensorFlow-only APIs must refuse on JAX with mldist's one-line error; the test reads the start
# of each message ("accepted" if one did not refuse, which fails it).
for name, call in (("strategy", mldist.strategy), ("tape", lambda: mldist.DistributedGradientTape(None))):
    try:
        call()
        out[name] = "accepted"
    except mldist.errors.UnsupportedError as exc:
        out[name] = str(exc)[:40]
import mldist.keras  # noqa: E402

out["profiler"] = mldist.keras.ProfileSteps(1, 2).profiler is None  # TensorFlow's profiler: refused in one line
print("RESULT " + json.dumps(out), flush=True)
