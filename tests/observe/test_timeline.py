"""A profiled 2-worker run leaves one Chrome trace per rank and a merged one with both ranks' all-reduces."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, WORKERS, check, clean_env, mldist
from mldist.tools.steptime import breakdown, load

#: glibc's last words when it finds the heap corrupted (TensorFlow's profiler on RING, see below):
#: "free(): invalid size", "munmap_chunk(): invalid pointer", "double free or corruption (out)", ...
GLIBC_HEAP_ABORT = r"\b(free|munmap_chunk|malloc|realloc)\(\): (invalid|corrupted)|double free or corruption"


def _events(path: Path) -> list[dict[str, Any]]:
    data = json.loads(gzip.decompress(path.read_bytes()))
    assert set(data) >= {"traceEvents"}
    return list(data["traceEvents"])


@pytest.mark.slow
def test_profiled_run_leaves_a_merged_trace_with_both_ranks_and_the_allreduce(tmp_path: Path, engine: str) -> None:
    env = clean_env(MLDIST_TRACE_DIR=str(tmp_path / "trace"))
    cmd = [
        "run",
        "-n",
        "2",
        "--communication",
        engine,
        "--profile-steps",
        "3:5",
        "--",
        PY,
        str(WORKERS / "profiled_fit.py"),
    ]
    # TensorFlow 2.21's profiler corrupts its heap in profiler.stop() when it merges host activities that
    # began on one thread and ended on another (a core dump shows the abort in TraceMeRecorder's
    # SplitEventTracker); glibc then aborts a RING worker, never on the MPI engine: 7 of 111 runs here
    # under load (host tracer level 1: 2 of 37). The README says so. Up to two new attempts, never more:
    # a CI run then fails this way far less than once in 1,000. The same corrupted heap may end the
    # worker in SIGSEGV instead (seen once, exit 139, in a full suite run).
    for _ in range(3):
        res = mldist(cmd, env=env, timeout=180)
        aborted = res.returncode == 134 and re.search(GLIBC_HEAP_ABORT, res.stderr)
        crashed = res.returncode == 139 and "killed by SIGSEGV" in res.stderr
        if not (engine == "ring" and (aborted or crashed)):
            break
    check(res)
    assert "[0] FIT-DONE 0" in res.stdout and "[1] FIT-DONE 1" in res.stdout
    trace = tmp_path / "trace"
    for rank in (0, 1):
        assert {e["pid"] for e in _events(trace / f"rank-{rank}.trace.json.gz")} == {rank}
    merged = _events(trace / "merged.trace.json.gz")
    names = {e["pid"]: e["args"]["name"] for e in merged if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    complete = [e for e in merged if e["ph"] == "X"]
    assert all(isinstance(e["ts"], float | int) and e["dur"] >= 0 for e in complete)
    for rank in (0, 1):
        reduces = [e for e in complete if e["pid"] == rank and "allreduce" in e["name"]]
        assert reduces, f"rank {rank} has no all-reduce in its timeline"
        assert all(e["cat"] == "collective" for e in reduces)
    # Aligned on a barrier: the ranks' recordings overlap in time.
    spans = [(min(e["ts"] for e in complete if e["pid"] == r), max(e["ts"] for e in complete if e["pid"] == r))
             for r in (0, 1)]  # fmt: skip
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans


@pytest.mark.slow
def test_a_profiled_jax_run_records_xlas_step_and_its_all_reduce(tmp_path: Path) -> None:
    """On KERAS_BACKEND=jax, --profile-steps records JAX's profiler: XLA's instructions on both ranks,
    the step's all-reduce found by the same search, and a breakdown of each step."""
    env = clean_env(KERAS_BACKEND="jax", MLDIST_TRACE_DIR=str(tmp_path / "trace"))
    cmd = ["run", "-n", "2", "--profile-steps", "3:5", "--", PY, str(WORKERS / "profiled_fit.py")]
    res = check(mldist(cmd, env=env, timeout=180))
    assert "[0] FIT-DONE 0" in res.stdout and "[1] FIT-DONE 1" in res.stdout
    merged = _events(tmp_path / "trace" / "merged.trace.json.gz")
    complete = [e for e in merged if e["ph"] == "X"]
    for rank in (0, 1):
        reduces = [e for e in complete if e["pid"] == rank and e["name"].startswith("allreduce (all-reduce")]
        assert len(reduces) >= 3, f"rank {rank}: {len(reduces)} of XLA's all-reduces in 3 steps"
        assert all(e["cat"] == "collective" for e in reduces)
    b = breakdown(load(tmp_path / "trace" / "merged.trace.json.gz"))
    for rank in ("0", "1"):
        assert b[rank]["steps"] == 3 and b[rank]["collectives_per_step"] >= 1, b
        assert b[rank]["compute_ms"] > 0 and b[rank]["collective_ms"] + b[rank]["wait_ms"] > 0, b
