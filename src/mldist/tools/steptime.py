"""Where a training step's time goes, read from a merged timeline (``mldist.runtime.collect.profiling``).

The trace of ``--profile-steps A:B`` holds, per rank, the step function's runs on the
Python thread and every op TensorFlow ran, or, for JAX, the step's dispatches on the Python
thread and every XLA instruction XLA's CPU threads ran. Per step and rank this splits the time into:

- ``compute``: the step function's ops other than those below (forward, backward, update);
- ``fuse``: concatenating gradients into buckets, splitting them back, scaling, copying
  (TensorFlow; XLA fuses inside its step, so 0 on JAX);
- ``collective``: the collectives themselves (``MPI_Allreduce`` in a ``numpy_function``,
  TensorFlow's collective ops, XLA's ``all-reduce``), without the wait below;
- ``wait``: inside a collective until the last rank arrived (the k-th collective of every
  rank is one collective; the timelines are aligned on a barrier);
- ``outside``: between steps, in Python (the training loop, callbacks, the input pipeline;
  on JAX: while XLA ran nothing of the step).

``collectives_per_step`` counts the collectives one step ran. On JAX, three figures say what
Python did per step (Keras's loop, read from the Python tracer's function events; mostly in
``outside``, though XLA may start the step while its dispatch returns):
``dispatch_ms`` (handing the compiled step to XLA), ``input_ms`` (the next batch from the
input pipeline) and ``placement_ms`` (putting it on the devices, Keras's
``jax.make_array_from_process_local_data``).

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
#: JAX: a jitted function's dispatch on the Python thread; XLA's CPU threads; their bookkeeping events.
_JIT_FUNCTION = re.compile(r"PjitFunction\((.+)\)")
_XLA_THREAD = "tf_XLA"
_XLA_WRAPPER = "ThunkExecutor"
#: XLA's collectives as the timeline names them (``allreduce (all-reduce.7)``); "broadcast" alone is
#: also in the names of XLA's fusions.
_XLA_COLLECTIVE = re.compile(r"(allreduce|allgather|broadcast|reducescatter|alltoall|permute) \(")
#: What Python does between JAX steps: the part, the function (as the Python tracer names it:
#: ``$file.py:line function``) and what the printed line calls it.
PYTHON_PARTS = {
    "input": ("get_jax_iterator", "next batch from the input pipeline"),
    "placement": ("_distribute_data", "batch put on the devices"),
}
#: Ops that build and unbuild the fused buffers: at the top level of the step function.
_FUSE = re.compile(r"(?:StatefulPartitionedCall/)?[^/]+:(ConcatV2|SplitV|Split|DeepCopy|Mul|Cast)")
_COLLECTIVE = re.compile(r"allreduce|allgather|broadcast|CollectiveReduce|CollectiveGather|CollectiveBcast", re.I)

Event = Mapping[str, Any]


Threads = dict[str, set[tuple[int, int]]]
Parts = dict[str, float]


def _by_rank(events: Iterable[Event]) -> tuple[dict[int, list[Event]], Threads]:
    """Complete events per rank, and the (rank, thread) pairs of the Python thread and of XLA's threads."""
    ranks: dict[int, list[Event]] = defaultdict(list)
    threads: Threads = {"python": set(), "xla": set()}
    for e in events:
        if e.get("ph") == "X":
            ranks[int(e["pid"])].append(e)
        elif e.get("name") == "thread_name":
            name = str(e.get("args", {}).get("name", ""))
            kind = "python" if name == "python" else "xla" if name.startswith(_XLA_THREAD) else ""
            if kind:
                threads[kind].add((int(e["pid"]), int(e["tid"])))
    return ranks, threads


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


def _dispatches(events: list[Event], python: set[tuple[int, int]]) -> list[Event]:
    """JAX: the outermost dispatches of the jitted function the Python thread called most often."""
    runs: dict[str, list[Event]] = defaultdict(list)
    for e in sorted(events, key=lambda e: float(e["ts"])):
        match = _JIT_FUNCTION.fullmatch(str(e["name"]))
        if match and (int(e["pid"]), int(e["tid"])) in python:
            same = runs[match.group(1)]
            if not same or float(e["ts"]) >= float(same[-1]["ts"]) + float(same[-1]["dur"]):
                same.append(e)  # not nested in the previous dispatch of the same function
    return max(runs.values(), key=len) if runs else []


def _union(spans: Iterable[tuple[float, float]]) -> float:
    """Total length covered by (start, end) intervals that may overlap.

    Example:
        >>> _union([(0, 2), (1, 3), (5, 6)])
        4.0
    """
    total, reach = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def _xla_parts(events: list[Event], steps: list[Event], xla: set[tuple[int, int]]) -> tuple[Parts, list[Event]]:
    """JAX: a step runs from one dispatch to the next; XLA's instructions in it are its graph."""
    first = float(steps[0]["ts"])
    ops = sorted(
        (
            e
            for e in events
            if (int(e["pid"]), int(e["tid"])) in xla
            and not str(e["name"]).startswith(_XLA_WRAPPER)
            and float(e["ts"]) >= first
        ),
        key=lambda e: float(e["ts"]),
    )
    coll = [e for e in ops if _XLA_COLLECTIVE.match(str(e["name"]))]
    n = len(steps)
    span = float(steps[-1]["ts"]) - first
    period = span / (n - 1) if n > 1 else _union(_spans(ops))
    parts = {"steps": n, "step": period, "graph": _union(_spans(ops)) / n, "fuse": 0.0}
    parts |= {"collective": _union(_spans(coll)) / n, "count": len(coll) / n}
    parts["dispatch"] = sum(float(s["dur"]) for s in steps) / n
    for part, (function, _) in PYTHON_PARTS.items():
        calls = [e for e in events if str(e["name"]).endswith(f" {function}") and float(e["ts"]) >= first]
        parts[part] = sum(float(e["dur"]) for e in calls) / n
    return parts, coll


def _spans(events: Iterable[Event]) -> list[tuple[float, float]]:
    return [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events]


def _tf_parts(events: list[Event], steps: list[Event]) -> tuple[Parts, list[Event]]:
    """TensorFlow: the step function's runs on the Python thread and the ops inside them."""
    ops = _inside(events, steps)
    coll = [e for e in ops if _COLLECTIVE.search(str(e["name"]))]
    n = len(steps)
    span = float(steps[-1]["ts"]) - float(steps[0]["ts"])
    period = span / (n - 1) if n > 1 else float(steps[0]["dur"])
    graph = sum(float(s["dur"]) for s in steps) / n
    fuse = sum(float(e["dur"]) for e in ops if _FUSE.fullmatch(str(e["name"]))) / n
    total = sum(float(e["dur"]) for e in coll) / n
    return {"steps": n, "step": period, "graph": graph, "fuse": fuse, "collective": total, "count": len(coll) / n}, coll


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
    ranks, threads = _by_rank(events)
    parts: dict[int, dict[str, float]] = {}
    collectives: dict[int, list[Event]] = {}
    for rank, evs in sorted(ranks.items()):
        steps = _steps(evs, threads["python"])
        if steps:
            parts[rank], collectives[rank] = _tf_parts(evs, steps)
        elif steps := _dispatches(evs, threads["python"]):
            parts[rank], collectives[rank] = _xla_parts(evs, steps, threads["xla"])
    if not parts:
        raise ConfigError(
            "the trace holds no training step (no tf.function ran on the Python thread, no jitted function "
            "was dispatched)"
        )
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
    return (
        {"steps": p["steps"], "step_ms": round(p["step"] / 1e3, 3)}
        | {f"{k}_ms": round(p[k] / 1e3, 3) for k in PARTS}
        | {"collectives_per_step": round(p["count"], 1)}
        | {f"{k}_ms": round(p[k] / 1e3, 3) for k in ("dispatch", *PYTHON_PARTS) if k in p}
    )


def load(path: str | Path) -> list[dict[str, Any]]:
    """The events of a (gzipped) Chrome trace written by :mod:`mldist.runtime.collect.profiling`."""
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
    if "dispatch_ms" in b:
        said = [("dispatch", "the step handed to XLA")] + [(k, what) for k, (_, what) in PYTHON_PARTS.items()]
        lines.append("  Python, per step: " + ", ".join(f"{what} {b[f'{k}_ms']:.3f} ms" for k, what in said))
    if "collectives_per_step" in b:
        sent = f", {b['collective_bytes'] / 1e6:.2f} MB reduced per step" if b.get("collective_bytes") else ""
        lines.append(f"  collectives   {b['collectives_per_step']:g} per step{sent}")
    return "\n".join(lines)


#: Bytes per element of XLA's element types.
_XLA_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_HLO_COLLECTIVE = re.compile(r"=\s*(.*?)\s(all-reduce|all-reduce-start|all-gather|all-gather-start|reduce-scatter)\(")
_HLO_SHAPE = re.compile(r"\b(" + "|".join(_XLA_BYTES) + r")\[([0-9,]*)\]")


def hlo_collectives(text: str) -> dict[str, int]:
    r"""How many collectives an optimized HLO module runs, and the bytes of their results.

    Read from XLA's dump of the compiled step (``XLA_FLAGS=--xla_dump_to=DIR``, the module's
    ``*.cpu_after_optimizations.txt``): the trace has the collectives' times, not their sizes.

    Example:
        >>> hlo_collectives("%all-reduce.7 = (f32[], f32[3,32]{1,0}) all-reduce(%a, %b), channel_id=1\n"
        ...                 "%all-reduce.8 = bf16[10]{0} all-reduce(%c), channel_id=2")
        {'count': 2, 'bytes': 408}
    """
    count = size = 0
    for match in _HLO_COLLECTIVE.finditer(text):
        count += 1
        for dtype, dims in _HLO_SHAPE.findall(match.group(1)):
            elements = 1
            for d in filter(None, dims.split(",")):
                elements *= int(d)
            size += elements * _XLA_BYTES[dtype]
    return {"count": count, "bytes": size}


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
