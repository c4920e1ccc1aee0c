"""Where a training step's time goes, read from a merged timeline (``mldist.runtime.profiling``).

The trace of ``--profile-steps A:B`` holds, per rank, the step function's runs on the
Python thread and every op TensorFlow ran. Per step and rank this splits the time into:

- ``compute``: the step function's ops other than those below (forward, backward, update);
- ``fuse``: concatenating gradients into buckets, splitting them back, scaling, copying;
- ``collective``: the collectives themselves (``MPI_Allreduce`` in a ``numpy_function``,
  or TensorFlow's collective ops), without the wait below;
- ``wait``: inside a collective until the last rank arrived (the k-th collective of every
  rank is one collective; the timelines are aligned on a barrier);
- ``outside``: between steps, in Python (the training loop, callbacks, the input pipeline).

Example:
    >>> events = [
    ...     {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "python"}},
    ...     {"ph": "X", "name": "EagerLocalExecute: __inference_step_7", "pid": 0, "tid": 1, "ts": 0, "dur": 900},
    ...     {"ph": "X", "name": "EagerLocalExecute: __inference_step_7", "pid": 0, "tid": 1, "ts": 1000, "dur": 900},
    ...     {"ph": "X", "name": "StatefulPartitionedCall/concat:ConcatV2", "pid": 0, "tid": 2, "ts": 10, "dur": 100},
    ... ]
    >>> b = breakdown(events)["mean"]
    >>> b["step_ms"], b["fuse_ms"], b["outside_ms"]
    (1.0, 0.05, 0.1)
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError

#: The parts of a step, in the order they are printed, and what each holds.
PARTS = {
    "compute": "the model's ops: forward, backward, update",
    "fuse": "gradients concatenated into buckets, split back, scaled, copied",
    "collective": "the collectives themselves",
    "wait": "in a collective until the last rank arrived",
    "outside": "between steps, in Python: training loop, callbacks, input",
}
_STEP_FUNCTION = re.compile(r"EagerLocalExecute: __inference_(.+)_[0-9]+")
#: Ops that build and unbuild the fused buffers: at the top level of the step function.
_FUSE = re.compile(r"(?:StatefulPartitionedCall/)?[^/]+:(ConcatV2|SplitV|Split|DeepCopy|Mul|Cast)")
_COLLECTIVE = re.compile(r"allreduce|allgather|broadcast|CollectiveReduce|CollectiveGather|CollectiveBcast", re.I)

Event = Mapping[str, Any]


def _by_rank(events: Iterable[Event]) -> tuple[dict[int, list[Event]], set[tuple[int, int]]]:
    """Complete events per rank, and the (rank, thread) pairs of the Python thread."""
    ranks: dict[int, list[Event]] = defaultdict(list)
    python: set[tuple[int, int]] = set()
    for e in events:
        if e.get("ph") == "X":
            ranks[int(e["pid"])].append(e)
        elif e.get("name") == "thread_name" and e.get("args", {}).get("name") == "python":
            python.add((int(e["pid"]), int(e["tid"])))
    return ranks, python


def _steps(events: list[Event], python: set[tuple[int, int]]) -> list[Event]:
    """Runs of the step function: the function the Python thread spent most time in."""
    runs: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        match = _STEP_FUNCTION.fullmatch(str(e["name"]))
        if match and (int(e["pid"]), int(e["tid"])) in python:
            runs[match.group(1)].append(e)
    if not runs:
        return []
    return sorted(max(runs.values(), key=lambda r: sum(float(e["dur"]) for e in r)), key=lambda e: float(e["ts"]))


def _inside(events: list[Event], steps: list[Event]) -> list[Event]:
    """Op events (``node:Type``) that start inside one of the steps, in time order."""
    spans = [(float(s["ts"]), float(s["ts"]) + float(s["dur"])) for s in steps]
    ops = [e for e in events if ":" in str(e["name"]) and not str(e["name"]).startswith("EagerLocalExecute")]
    return sorted((e for e in ops if any(a <= float(e["ts"]) < b for a, b in spans)), key=lambda e: float(e["ts"]))


def _waits(collectives: dict[int, list[Event]]) -> dict[int, float]:
    """Microseconds each rank spent in its collectives before the last rank arrived (0 if they differ)."""
    counts = {len(c) for c in collectives.values()}
    waits = dict.fromkeys(collectives, 0.0)
    if len(counts) != 1:
        return waits  # ranks ran different collectives in the window: no matching
    for k in range(counts.pop()):
        last = max(float(c[k]["ts"]) for c in collectives.values())
        for rank, c in collectives.items():
            waits[rank] += min(float(c[k]["dur"]), max(0.0, last - float(c[k]["ts"])))
    return waits


def breakdown(events: Iterable[Event]) -> dict[str, dict[str, float]]:
    """Per rank (``"0"``, ``"1"``, ...) and their ``"mean"``: ms per step in each part of :data:`PARTS`.

    Raises ConfigError when the trace holds no step function.
    """
    ranks, python = _by_rank(events)
    parts: dict[int, dict[str, float]] = {}
    collectives: dict[int, list[Event]] = {}
    for rank, evs in sorted(ranks.items()):
        steps = _steps(evs, python)
        if not steps:
            continue
        ops = _inside(evs, steps)
        collectives[rank] = [e for e in ops if _COLLECTIVE.search(str(e["name"]))]
        n = len(steps)
        span = float(steps[-1]["ts"]) - float(steps[0]["ts"])
        period = span / (n - 1) if n > 1 else float(steps[0]["dur"])
        graph = sum(float(s["dur"]) for s in steps) / n
        fuse = sum(float(e["dur"]) for e in ops if _FUSE.fullmatch(str(e["name"]))) / n
        coll = sum(float(e["dur"]) for e in collectives[rank]) / n
        parts[rank] = {"steps": n, "step": period, "graph": graph, "fuse": fuse, "collective": coll}
    if not parts:
        raise ConfigError("the trace holds no training step (no tf.function ran on the Python thread)")
    for rank, wait in _waits(collectives).items():
        p = parts[rank]
        p["wait"] = wait / p["steps"]
        p["collective"] -= p["wait"]
        p["compute"] = max(0.0, p["graph"] - p["fuse"] - p["collective"] - p["wait"])
        p["outside"] = max(0.0, p["step"] - p["graph"])
    out = {str(r): _ms(p) for r, p in parts.items()}
    out["mean"] = {k: round(sum(o[k] for o in out.values()) / len(out), 3) for k in next(iter(out.values()))}
    return out


def _ms(p: dict[str, float]) -> dict[str, float]:
    return {"steps": p["steps"], "step_ms": round(p["step"] / 1e3, 3)} | {
        f"{k}_ms": round(p[k] / 1e3, 3) for k in PARTS
    }


def load(path: str | Path) -> list[dict[str, Any]]:
    """The events of a (gzipped) Chrome trace written by :mod:`mldist.runtime.profiling`."""
    data = Path(path).read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    trace = json.loads(data)
    return list(trace["traceEvents"] if isinstance(trace, dict) else trace)


def format_breakdown(b: Mapping[str, float], title: str = "where a step's time goes") -> str:
    """Lines of a breakdown (one rank's or the mean): ms per step and share of the step.

    Example:
        >>> print(format_breakdown({"steps": 2, "step_ms": 2.0, "compute_ms": 1.5, "fuse_ms": 0.5,
        ...     "collective_ms": 0.0, "wait_ms": 0.0, "outside_ms": 0.0}).splitlines()[2])
          compute       1.500 ms   75%  the model's ops: forward, backward, update
    """
    step = b["step_ms"] or 1.0
    lines = [f"{title} ({int(b['steps'])} steps, ms per step):", f"  {'step':12s} {b['step_ms']:6.3f} ms  100%"]
    for part, what in PARTS.items():
        value = b[f"{part}_ms"]
        lines.append(f"  {part:12s} {value:6.3f} ms  {100 * value / step:3.0f}%  {what}")
    return "\n".join(lines)


def with_breakdown(row: dict[str, Any], trace: Path) -> dict[str, Any]:
    """A benchmark ``row`` with where its steps' time went, from ``trace`` (printed too).

    Example::

        row = with_breakdown(row, Path("runs/bench-x/n2-mpi/trace/merged.trace.json.gz"))
    """
    if not trace.is_file():
        print(f"mldist: no merged trace at {trace}: did the profiled steps run (warm-up + iterations)?", flush=True)
        return row
    mean = breakdown(load(trace))["mean"]
    print(format_breakdown(mean, f"where a step's time goes (trace: {trace})"), flush=True)
    return row | {"trace": str(trace), "breakdown_ms": mean}
