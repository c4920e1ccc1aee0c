"""Worker: mldist's collectives on KERAS_BACKEND=jax print one ``RESULT {json}`` line per rank.

Run with KERAS_BACKEND=jax under ``mldist run -n 2`` (or alone: every collective is an identity).
"""

from __future__ import annotations

import json
import os
import platform
import time

import numpy as np

import mldist
import mldist.errors
from mldist.runtime.engines import engine, jax_cpu


def _idle_threads() -> list[int]:
    """This process's threads at SCHED_IDLE (mldist moves Gloo's event loop there)."""
    found = []
    for task in os.listdir("/proc/self/task"):
        try:
            if os.sched_getscheduler(int(task)) == os.SCHED_IDLE:
                found.append(int(task))
        except OSError:
            continue
    return found


def _waits_like_gloos_loop(tid: int) -> bool:
    """Whether thread ``tid`` is seen waiting in epoll_wait(fd, events, 64, 10) within 0.2 s."""
    for _ in range(100):
        with open(f"/proc/self/task/{tid}/syscall") as fh:
            if jax_cpu.is_event_loop(fh.read(), platform.machine()):
                return True
        time.sleep(0.002)
    return False


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

out["profiler"] = mldist.keras.ProfileSteps(1, 2).profiler is not None  # JAX's profiler on JAX
out["idle_threads"] = sorted(_idle_threads())
out["idled"] = sorted(getattr(engine.running(), "idled", ()))
out["loops"] = [_waits_like_gloos_loop(t) for t in out["idle_threads"]]  # type: ignore[attr-defined]
print("RESULT " + json.dumps(out), flush=True)
