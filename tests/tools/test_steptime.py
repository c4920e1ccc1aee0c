"""Where a step's time goes: the breakdown of a merged timeline, on hand-made traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from mldist.errors import ConfigError
from mldist.tools.steptime import breakdown, format_breakdown, hlo_collectives, load

STEP = "EagerLocalExecute: __inference_multi_step_on_iterator_406"


def _rank(pid: int, starts: list[float], ops: list[tuple[str, float, float]]) -> list[dict[str, Any]]:
    """One rank: a Python thread running 1 ms steps at ``starts`` (us), and ops (name, start, dur) on another."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": 2, "args": {"name": "tf_Compute/1"}},
    ]
    events += [{"ph": "X", "name": STEP, "pid": pid, "tid": 1, "ts": t, "dur": 1000.0} for t in starts]
    events += [{"ph": "X", "name": n, "pid": pid, "tid": 2, "ts": t, "dur": d} for n, t, d in ops]
    return events


def _ops(offset: float, wait: float) -> list[tuple[str, float, float]]:
    """Per step: a conv, the concat, the all-reduce (arriving at ``offset``, waiting ``wait``), the split."""
    return [
        ("StatefulPartitionedCall/sequential/conv/Conv2D:_MklNativeConv2D", 0.0, 500.0),
        ("StatefulPartitionedCall/concat:ConcatV2", 500.0, 50.0),
        ("StatefulPartitionedCall/mpi_allreduce_sum:PyFunc", offset, 100.0 + wait),
        ("StatefulPartitionedCall/split:SplitV", 800.0, 50.0),
    ]


def _two_ranks(step_period: float = 1200.0) -> list[dict[str, Any]]:
    starts = [0.0, step_period, 2 * step_period]
    # Rank 1 reaches the all-reduce 200 us before rank 0 and waits for it.
    barrier = [("mpi_allreduce_sum:PyFunc", -500.0, 300.0)]  # eager, before the steps: not a step's
    return [
        *_rank(0, starts, barrier + [(n, s + t, d) for s in starts for n, t, d in _ops(600.0, 0.0)]),
        *_rank(1, starts, barrier + [(n, s + t, d) for s in starts for n, t, d in _ops(400.0, 200.0)]),
    ]


def test_each_part_of_a_step_per_rank_and_their_mean() -> None:
    b = breakdown(_two_ranks())
    assert b["0"] == {
        "steps": 3, "step_ms": 1.2, "compute_ms": 0.8, "fuse_ms": 0.1,
        "collective_ms": 0.1, "wait_ms": 0.0, "outside_ms": 0.2, "collectives_per_step": 1.0,
    }  # fmt: skip
    assert (b["1"]["wait_ms"], b["1"]["collective_ms"], b["1"]["compute_ms"]) == (0.2, 0.1, 0.6)
    assert b["mean"]["wait_ms"] == 0.1 and b["mean"]["step_ms"] == 1.2


def test_ranks_that_ran_different_collectives_get_no_wait_split() -> None:
    events = _two_ranks()
    events = [e for e in events if not (e["pid"] == 1 and "PyFunc" in e["name"] and e["ts"] > 2000)]
    b = breakdown(events)
    assert b["0"]["wait_ms"] == b["1"]["wait_ms"] == 0.0
    assert b["1"]["collective_ms"] == pytest.approx(0.2, abs=1e-3)  # 2 of 3 steps with 300 us each


def test_a_trace_without_a_step_function_is_refused() -> None:
    with pytest.raises(ConfigError, match="no training step"):
        breakdown([e for e in _two_ranks() if e["name"] != STEP])


def test_gzipped_and_plain_traces_load_alike(tmp_path: Path) -> None:
    data = json.dumps({"traceEvents": _two_ranks()}).encode()
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(data))
    (tmp_path / "t.json").write_bytes(data)
    assert load(tmp_path / "t.json.gz") == load(tmp_path / "t.json") == _two_ranks()


def test_the_printed_lines_add_up_to_the_step() -> None:
    text = format_breakdown(breakdown(_two_ranks())["mean"])
    rows = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()[1:-1]}
    assert list(rows) == ["step", "compute", "fuse", "collective", "wait", "outside"]
    assert text.splitlines()[-1].split() == ["collectives", "1", "per", "step"]
    assert sum(v for k, v in rows.items() if k != "step") == pytest.approx(rows["step"])


# -- JAX: dispatches on the Python thread, XLA's instructions on its CPU threads -----------------------

JIT = "PjitFunction(train_step)"


def _jax_rank(pid: int, starts: list[float], arrive: float) -> list[dict[str, Any]]:
    """One JAX rank: 1 ms steps dispatched at ``starts`` (each dispatch nested in another, as JAX's are),
    XLA's instructions on two threads (overlapping), the all-reduce at ``arrive`` us into each step."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": n}}
        for t, n in ((1, "python"), (2, "tf_XLAEigen/-5679"), (3, "tf_XLAPjRtCpuClient/3532"))
    ]
    for s in starts:
        events += [
            {"ph": "X", "name": JIT, "pid": pid, "tid": 1, "ts": s, "dur": 30.0},
            {"ph": "X", "name": JIT, "pid": pid, "tid": 1, "ts": s + 5, "dur": 20.0},  # nested: the same dispatch
            {"ph": "X", "name": "PjitFunction(_identity_fn)", "pid": pid, "tid": 1, "ts": s + 900, "dur": 10.0},
            {"ph": "X", "name": "$tf_dataset_adapter.py:45 get_jax_iterator", "pid": pid, "tid": 1, "ts": s + 820,
             "dur": 50.0},
            {"ph": "X", "name": "$trainer.py:1066 _distribute_data", "pid": pid, "tid": 1, "ts": s + 880, "dur": 100.0},
            {"ph": "X", "name": "ThunkExecutor::Execute", "pid": pid, "tid": 2, "ts": s + 40, "dur": 960.0},
            {"ph": "X", "name": "ynn_fusion.8", "pid": pid, "tid": 2, "ts": s + 50, "dur": 300.0},
            {"ph": "X", "name": "wrapped_broadcast", "pid": pid, "tid": 3, "ts": s + 250, "dur": 250.0},
            {"ph": "X", "name": "allreduce (all-reduce.7)", "pid": pid, "tid": 2, "ts": s + arrive,
             "dur": 800.0 - arrive},
        ]  # fmt: skip
    return events


def test_a_jax_step_runs_from_dispatch_to_dispatch_with_xlas_instructions_inside() -> None:
    starts = [0.0, 1000.0, 2000.0]
    # Rank 0 reaches the all-reduce at 600 us, rank 1 at 500 us: rank 1 waits 100 us; both end at 800 us.
    b = breakdown([*_jax_rank(0, starts, 600.0), *_jax_rank(1, starts, 500.0)])
    # Busy: 50..500 (two threads overlapping) and the all-reduce: 0.45 ms + its length.
    assert b["0"] == {
        "steps": 3, "step_ms": 1.0, "compute_ms": 0.45, "fuse_ms": 0.0,
        "collective_ms": 0.2, "wait_ms": 0.0, "outside_ms": 0.35, "collectives_per_step": 1.0,
        "dispatch_ms": 0.03, "input_ms": 0.05, "placement_ms": 0.1,
    }  # fmt: skip
    assert "Python, per step: the step handed to XLA 0.030 ms" in format_breakdown(b["mean"])
    assert (b["1"]["compute_ms"], b["1"]["collective_ms"], b["1"]["wait_ms"]) == (0.45, 0.2, 0.1)
    assert b["1"]["outside_ms"] == 0.25  # 1 ms less 0.45 + 0.3 busy


def test_the_collectives_of_a_compiled_step_counted_with_their_bytes() -> None:
    module = """
  %all-reduce.7 = (f32[], f32[3,3,1,32]{3,2,1,0}, f32[64,5408]{1,0}) all-reduce(%a, %b, %c), channel_id=1
  %get-tuple-element.5 = f32[3,3,1,32]{3,2,1,0} get-tuple-element(%all-reduce.7), index=1
  %all-reduce-start.2 = bf16[8]{0} all-reduce-start(%d), channel_id=2
  %all-reduce-done.2 = bf16[8]{0} all-reduce-done(%all-reduce-start.2)
  %all-gather.1 = s32[2,4]{1,0} all-gather(%e), dimensions={0}
"""
    assert hlo_collectives(module) == {"count": 3, "bytes": 4 * (1 + 288 + 64 * 5408) + 2 * 8 + 4 * 8}
    assert hlo_collectives("") == {"count": 0, "bytes": 0}
