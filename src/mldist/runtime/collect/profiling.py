"""Timelines: the backend's profiler on every rank for chosen steps, merged into one Chrome trace.

``mldist run --profile-steps A:B`` (or ``MLDIST_PROFILE_STEPS=A:B``) makes every
rank record steps A to B (counted from 0) with TensorFlow's profiler, or JAX's on
``KERAS_BACKEND=jax`` (both write the same XSpace format), and write ``trace/rank-R.trace.json.gz``;
rank 0 then writes ``trace/merged.trace.json.gz``: one process per rank ("rank R"),
complete events (``ph: "X"``) that chrome://tracing and Perfetto open. The ranks'
timelines are aligned on a barrier taken just before recording starts, so clock
skew between nodes does not shift them. Collectives are named so that a search
for "allreduce" (or "allgather", "broadcast") finds them on both engines.

Keras ``fit`` gets this from ``mldist.keras.default_callbacks()``; a custom loop
calls ``begin``/``end`` around its steps.

Example::

    profiler = StepProfiler.from_env()          # None unless MLDIST_PROFILE_STEPS is set
    for step, batch in enumerate(ds):
        if profiler: profiler.begin(step)
        train_step(batch)
        if profiler: profiler.end(step)
"""

from __future__ import annotations

import gzip
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...base import envvalues
from ...base.files import atomic_write
from ...errors import ConfigError
from ..start import worker
from . import collectives

_STEPS = re.compile(r"([0-9]{1,9}):([0-9]{1,9})")
#: TensorFlow op types of its collectives, and the name a search should find them by.
_COLLECTIVES = {"CollectiveReduce": "allreduce", "CollectiveGather": "allgather", "CollectiveBcast": "broadcast"}
#: XLA's collective instructions (JAX's step), and the same names.
_XLA_COLLECTIVES = {
    "all-reduce": "allreduce",
    "all-gather": "allgather",
    "collective-broadcast": "broadcast",
    "reduce-scatter": "reducescatter",
    "all-to-all": "alltoall",
    "collective-permute": "permute",
}
_XLA_COLLECTIVE = re.compile(r"(" + "|".join(_XLA_COLLECTIVES) + r")(?:-start|-done)?(?:\.[0-9]+)*")


def parse_steps(text: str) -> tuple[int, int]:
    """``A:B`` as (first, last) step, both included.

    Example:
        >>> parse_steps("10:12")
        (10, 12)
    """
    match = _STEPS.fullmatch(text)
    if not match or int(match.group(1)) > int(match.group(2)):
        raise ConfigError(f"profile steps {text!r}: write FIRST:LAST with FIRST <= LAST, e.g. 10:12")
    return int(match.group(1)), int(match.group(2))


def trace_dir(env: Mapping[str, str]) -> Path:
    """Where traces go: ``MLDIST_TRACE_DIR``, else the run directory's ``trace/``, else ``./trace``."""
    if chosen := envvalues.TRACE_DIR.read(env):
        return Path(chosen)
    return Path(envvalues.RUN_DIR.read(env) or ".") / "trace"


def event_name(name: str) -> str:
    """A readable, searchable name for a TensorFlow op event (``node:OpType``).

    Example:
        >>> event_name("StatefulPartitionedCall/CollectiveReduceV2:CollectiveReduceV2")
        'allreduce (StatefulPartitionedCall/CollectiveReduceV2:CollectiveReduceV2)'
        >>> event_name("model/dense/MatMul:MatMul"), event_name("all-reduce.7")
        ('model/dense/MatMul:MatMul', 'allreduce (all-reduce.7)')
    """
    xla = _XLA_COLLECTIVE.fullmatch(name)
    if xla:
        return f"{_XLA_COLLECTIVES[xla.group(1)]} ({name})"
    op_type = name.rpartition(":")[2]
    for prefix, label in _COLLECTIVES.items():
        if op_type.startswith(prefix):
            return f"{label} ({name})"
    return name


def _category(name: str, line: str) -> str:
    lowered = name.lower()
    if any(word in lowered for word in ("allreduce", "allgather", "broadcast")):
        return "collective"
    if line.startswith("tf_data") or "iterator" in lowered or "dataset" in lowered:
        return "input"
    return "compute"


def xspace_events(path: Path, rank: int, shift_us: float) -> list[dict[str, Any]]:
    """Chrome trace events of one rank's XSpace file (host plane), moved by ``shift_us``."""
    from .. import compat

    space = compat.read_xspace(path)
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}}]
    lines = [(plane, line) for plane in space.planes for line in plane.lines]
    for tid, (plane, line) in enumerate(lines, start=1):
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": line.name}})
        for ev in line.events:
            name = event_name(plane.event_metadata[ev.metadata_id].name)
            start_us = line.timestamp_ns / 1e3 + ev.offset_ps / 1e6 + shift_us
            events.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": _category(name, line.name),
                    "pid": rank,
                    "tid": tid,
                    "ts": round(start_us, 3),
                    "dur": round(ev.duration_ps / 1e6, 3),
                }
            )
    return events


def _write_trace(path: Path, events: list[dict[str, Any]]) -> None:
    """A Chrome trace at ``path``: gzipped when the name ends in ``.gz``."""
    data = json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}).encode()
    atomic_write(path, gzip.compress(data) if path.name.endswith(".gz") else data)


def merge_traces(paths: list[Path], out: Path) -> None:
    """One trace holding every rank's events (each file's ``traceEvents``, in rank order)."""
    events: list[dict[str, Any]] = []
    for path in paths:
        events += json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    _write_trace(out, events)


def _on_tensorflow() -> bool:
    return worker.init().decision.traits.runs_tensorflow


def _zeros() -> Any:
    """A one-element tensor of the backend's kind, for a barrier."""
    if _on_tensorflow():
        import tensorflow as tf

        return tf.zeros([1])
    import numpy as np

    return np.zeros(1, np.float32)


def _profiler() -> tuple[Callable[[str], Any], Callable[[], Any]]:
    """(start(log dir), stop()) of the profiler that sees this backend's step: TensorFlow's or JAX's."""
    if _on_tensorflow():
        import tensorflow as tf

        return tf.profiler.experimental.start, tf.profiler.experimental.stop
    import jax

    return jax.profiler.start_trace, jax.profiler.stop_trace


class Recording:
    """The backend's profiler on every rank between :meth:`start` and :meth:`stop` (both collective).

    Each rank writes ``out_dir/rank-R.trace.json.gz``; rank 0 merges them into ``merged``.
    The timelines are aligned on a barrier taken just before recording starts.

    Example::

        rec = Recording(Path("trace"), Path("trace/merged.trace.json.gz"))
        rec.start(); train_a_little(); rec.stop()
    """

    def __init__(self, out_dir: Path, merged: Path) -> None:
        self.out_dir, self.merged = out_dir, merged
        self.shift_us = 0.0

    def _barrier(self) -> None:
        collectives.allreduce(_zeros(), "sum")

    def start(self) -> None:
        """Start recording on this rank, after a barrier every rank shares."""
        self._barrier()
        after_barrier = time.time_ns()
        _profiler()[0](str(self.out_dir / f"raw-rank-{worker.rank()}"))
        # The profile's time 0 is its start: place it where this rank left the barrier.
        self.shift_us = (time.time_ns() - after_barrier) / 1e3

    def stop(self) -> None:
        """Stop recording, write this rank's trace; rank 0 merges every rank's once all are written."""
        self._barrier()  # no rank still has a collective in flight while tracing stops
        _profiler()[1]()
        rank = worker.rank()
        raw = sorted((self.out_dir / f"raw-rank-{rank}").rglob("*.xplane.pb"))
        _write_trace(self.out_dir / f"rank-{rank}.trace.json.gz", xspace_events(raw[-1], rank, self.shift_us))
        self._barrier()  # every rank's file is written
        if rank == 0:
            ranks = [self.out_dir / f"rank-{r}.trace.json.gz" for r in range(worker.size())]
            merge_traces(ranks, self.merged)


class StepProfiler:
    """Record steps ``first``..``last`` on every rank; rank 0 merges the ranks' traces at the end."""

    def __init__(self, first: int, last: int, out_dir: Path) -> None:
        self.first, self.last, self.out_dir = first, last, out_dir
        self.recording = Recording(out_dir, out_dir / "merged.trace.json.gz")
        self.done = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StepProfiler | None:
        """A profiler for ``MLDIST_PROFILE_STEPS``, or None when it is not set."""
        env = os.environ if env is None else env
        text = envvalues.PROFILE_STEPS.read(env)
        return cls(*parse_steps(text), trace_dir(env)) if text else None

    def begin(self, step: int) -> None:
        """Call before each step: recording starts at ``first``, after a barrier every rank shares."""
        if step == self.first and not self.done:
            self.recording.start()

    def end(self, step: int) -> None:
        """Call after each step: at ``last`` recording stops and the traces are written (rank 0 merges)."""
        if step == self.last and not self.done:
            self.recording.stop()
            self.done = True
