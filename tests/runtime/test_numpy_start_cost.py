"""A numpy-only worker's start stays light (issue 62): with 64 ranks on 2 cores, CPU is the wall.

Each module below cost every rank 1-4 ms of CPU on that path without being used there: ``logging``
(with ``concurrent.futures``, ``queue`` and ``string``: the MPI engine's progress thread, which a
numpy job never starts, and the TensorFlow retracing filter), and ``tempfile`` (with ``random``,
``shutil`` and the compressors: only where ``/dev/shm`` or the run directory is missing).
"""

from __future__ import annotations

from pathlib import Path

from helpers import PY, check, clean_env, mldist, results

#: Modules a numpy-only ``mldist.init()`` + all-reduce must not import.
UNUSED = ("logging", "concurrent.futures", "queue", "tempfile", "random", "shutil")

SCRIPT = """
import json, sys
import numpy as np, mldist
ctx = mldist.init()
total = mldist.allreduce(np.full(3, ctx.rank + 1.0))  # the mean: 1.5 on 2 ranks
print("RESULT " + json.dumps({"rank": ctx.rank, "sum": total.tolist(),
      "unused": sorted(m for m in %r if m in sys.modules)}), flush=True)
"""


def test_a_numpy_worker_imports_no_logging_futures_or_tempfile(tmp_path: Path) -> None:
    script = tmp_path / "np_start.py"
    script.write_text(SCRIPT % (UNUSED,))
    # Without the tests' lean sitecustomize: its importlib.abc brings tempfile before the script starts.
    argv = ["run", "-n", "2", "--communication", "mpi", "--no-run-dir", "--", PY, str(script)]
    res = check(mldist(argv, timeout=180, env=clean_env(PYTHONPATH="")))
    rows = results(res.stdout)
    assert [r["rank"] for r in rows] == [0, 1]
    for row in rows:
        assert row["sum"] == [1.5, 1.5, 1.5]
        assert row["unused"] == [], row
