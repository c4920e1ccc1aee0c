"""The stalled-collective watch: the pure parts, and 2 real workers of which one stalls (slow)."""

from __future__ import annotations

import time

import pytest

from helpers import PY, USERS_GC, WORKERS, check, clean_env, mldist
from mldist.base import processwide
from mldist.errors import ConfigError
from mldist.runtime.context import STATE
from mldist.runtime.watch import stall


def test_nccl_names_ring_as_the_fallback() -> None:
    line = stall.stall_message(3, "nccl", "allreduce(sum)", 601.4, 600)
    assert line.startswith("rank 3 waited 601 s in allreduce(sum) (engine nccl)")
    assert "MLDIST_COLLECTIVE_TIMEOUT=600" in line and "set MLDIST_COMMUNICATION=ring" in line


@pytest.mark.parametrize("engine, hint", [("ring", "MLDIST_COMMUNICATION=mpi"), ("mpi", "MLDIST_COMMUNICATION=ring")])
def test_other_engines_name_their_own_hint(engine: str, hint: str) -> None:
    line = stall.stall_message(0, engine, "broadcast", 5, 3)
    assert hint in line and "NCCL" not in line and "raise MLDIST_COLLECTIVE_TIMEOUT" in line


@pytest.mark.parametrize("raw, seconds", [("", 600.0), ("0", 0.0), ("2.5", 2.5), (" 30 ", 30.0)])
def test_timeout_from_the_environment(raw: str, seconds: float) -> None:
    assert stall.collective_timeout({"MLDIST_COLLECTIVE_TIMEOUT": raw}) == seconds


@pytest.mark.parametrize("raw", ["-1", "soon", "inf", "nan"])
def test_invalid_timeout_names_the_value_and_the_fix(raw: str) -> None:
    with pytest.raises(ConfigError, match=rf"MLDIST_COLLECTIVE_TIMEOUT='{raw}' is not a number of seconds.*or 0"):
        stall.collective_timeout({"MLDIST_COLLECTIVE_TIMEOUT": raw})


def test_the_oldest_collective_in_flight_past_the_timeout_is_overdue() -> None:
    now = [100.0]
    watch = stall.Watch(1, "nccl", 10, clock=lambda: now[0])
    first = watch.begin("allreduce(sum)")
    now[0] = 105
    second = watch.begin("broadcast")
    now[0] = 110
    assert watch.overdue() is None  # exactly at the limit
    now[0] = 112
    assert (watch.overdue() or "").startswith("rank 1 waited 12 s in allreduce(sum)")
    watch.end(first)
    assert watch.overdue() is None
    now[0] = 116
    assert (watch.overdue() or "").startswith("rank 1 waited 11 s in broadcast")
    watch.end(second)
    watch.end(second)  # twice is harmless
    assert watch.overdue() is None


def test_the_watch_is_the_workers_context_not_the_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The started watch and the sampler live in the context's state (mldist.runtime.context.STATE), which the
    marks of every engine reach; the watch's module keeps no state of its own (no ``global``)."""
    import ast
    import inspect

    monkeypatch.setattr(STATE, "watch", None)
    monkeypatch.setattr(STATE, "sampler", None)
    assert stall.begin("x") == 0 and not stall.active()
    sampler = lambda frame, now, wall: None  # noqa: E731
    stall.sample_with(sampler)
    watch = stall.start(0, "ring", {}, timeout=3600.0)  # one rank, no progress folder: nothing written
    assert watch is not None and STATE.watch is watch and watch.sampler is sampler and stall.active()
    assert stall.start(0, "ring", {}, timeout=3600.0) is watch  # once per process
    token = stall.begin("allreduce(sum)")
    stall.step()
    assert token > 0 and watch.steps == 1 and watch.record(time.monotonic()).began == 1
    stall.end(token)
    assert watch.record(time.monotonic()).finished == 1
    tree = ast.parse(inspect.getsource(stall))
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Global)]


@pytest.mark.parametrize(("rank", "aside", "carried"), [(1, False, True), (0, False, True), (1, True, False)])
def test_every_ranks_records_carry_its_waits_where_rank_0_reads_them_there(
    monkeypatch: pytest.MonkeyPatch, rank: int, aside: bool, carried: bool
) -> None:
    """RING and NCCL: rank 0's slow-rank account reads every rank's waits from the records (the other ranks
    register no watcher of their own); MPI and JAX carry them in their rounds, so records leave them out."""
    import types

    monkeypatch.setattr(STATE, "watch", None)
    monkeypatch.setattr(STATE, "engine", types.SimpleNamespace(gathers_aside=aside, aside=lambda r, s: None))
    monkeypatch.setattr(processwide, "at_exit", lambda *args: None)  # no exit handler left in the test process
    watch = stall.start(rank, "ring", {}, size=2, timeout=3600.0)
    assert watch is not None
    recorded = [w for w in watch.watchers if isinstance(w, stall.RecordedWaits)]  # a watcher registered with it
    watch.watchers = [*recorded]  # its thread goes on in this process: no account turns there
    token = watch.begin("allreduce(sum)")
    watch.end(token)
    assert bool(recorded) is carried and bool(watch.record(time.monotonic()).waits) is carried
    assert not {"_waits", "published_waits"} & set(vars(watch))  # the watch carries none of the account's state


def test_graph_counters_in_flight_since_they_last_changed() -> None:
    now, counts = [0.0], [(0, 0, 0)]
    watch = stall.Watch(
        0, "nccl", 5, probe=lambda: counts[0], names=["allreduce(sum)", "broadcast"], clock=lambda: now[0]
    )
    assert watch.overdue() is None
    counts[0], now[0] = (1, 0, 1), 1  # a broadcast started
    assert watch.overdue() is None
    now[0] = 7
    assert "rank 0 waited 6 s in broadcast (engine nccl)" in (watch.overdue() or "")
    counts[0] = (2, 1, 0)  # it finished and an all-reduce started: the clock starts again
    assert watch.overdue() is None
    now[0] = 13
    assert "waited 6 s in allreduce(sum)" in (watch.overdue() or "")
    counts[0] = (2, 2, 0)
    now[0] = 100
    assert watch.overdue() is None


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eager", "fit"])
def test_a_stalled_rank_ends_the_job_within_seconds_naming_the_collective(engine: str, mode: str) -> None:
    env = clean_env(**USERS_GC, MLDIST_COLLECTIVE_TIMEOUT="3")
    cmd = ["run", "-n", "2", "--communication", engine, "--", PY, str(WORKERS / "stall.py"), mode]
    res = check(mldist(cmd, env=env, timeout=120), 1)
    warm = [float(line.split()[-1]) for line in res.stdout.splitlines() if "WARM" in line]
    took = time.time() - max(warm)
    assert "UNREACHABLE" not in res.stdout
    stalled = [line for line in res.stderr.splitlines() if "waited" in line and "MLDIST_COLLECTIVE_TIMEOUT=3" in line]
    assert stalled, res.stderr[-3000:]
    assert "rank 0 waited" in stalled[0] and f"(engine {engine})" in stalled[0]
    late = [line for line in res.stderr.splitlines() if "rank 1 has not reached collective #" in line]
    assert late and "allreduce(sum)" in late[0] and "stall.py:" in late[0], res.stderr[-3000:]  # where it sleeps
    assert "rank 0 exited with code 1" in res.stderr
    assert took < 20, f"the job ended {took:.1f} s after the stall began"


def test_xla_steps_after_the_first_count_as_one_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL inside an XLA-compiled step gives no marks: mldist.keras.StallWatch times the whole step."""
    import types

    from mldist.keras import StallWatch, default_callbacks

    now = [0.0]
    watch = stall.Watch(0, "nccl", 10, clock=lambda: now[0])
    monkeypatch.setattr(STATE, "watch", watch)
    steps: list[int] = []
    model = types.SimpleNamespace(jit_compile=True, train_function=lambda: steps.append(1))
    cb = StallWatch()
    cb.set_model(model)
    cb.on_train_begin()
    cb.on_train_batch_begin(0)
    model.train_function()  # the first step compiles: not timed
    now[0] = 100.0
    assert watch.overdue() is None
    cb.on_train_batch_end(0)
    cb.on_train_batch_begin(1)
    now[0] = 130.0  # a callback's on_train_batch_begin after StallWatch's: not in the step yet
    assert watch.overdue() is None
    model.train_function()
    now[0] = 141.0
    line = watch.overdue()
    assert line is not None and "a training step compiled by XLA" in line and "MLDIST_COMMUNICATION=ring" in line
    cb.on_train_batch_end(1)
    assert watch.overdue() is None
    cb.on_train_end()
    assert steps == [1, 1] and model.train_function() is None and steps == [1, 1, 1]  # its own function back
    raised = StallWatch()  # a fit that raised: no on_train_end, the wrapper stays on the model
    raised.set_model(model)
    raised.on_train_begin()
    again = StallWatch()
    again.set_model(model)
    again.on_train_begin()
    assert again._inner is raised._inner  # Keras's own function, not the stale wrapper
    plain_model = types.SimpleNamespace(jit_compile=False, train_function=lambda: None)
    plain = StallWatch()
    plain.set_model(plain_model)  # collectives are marked one by one there
    plain.on_train_begin()
    for b in range(3):
        plain.on_train_batch_begin(b)
        plain_model.train_function()
        now[0] += 50
        assert watch.overdue() is None
        plain.on_train_batch_end(b)
    assert any(isinstance(c, StallWatch) for c in default_callbacks())
