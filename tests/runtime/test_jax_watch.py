"""Every JAX computation across processes is watched, with no mark: the sampled wait, and real ranks (slow).

tests/workers/jax_stuck.py: rank 1 stops before building the model, inside ``evaluate`` (JAX's
C++ fast path runs the step: no Python frame of JAX's), or before a call of the script's own
jitted function; rank 0 waits in the computation. And a healthy run whose rank 0 waits in every
call briefly, far past the timeout in all: no stall.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from helpers import PY, USERS_GC, WORKERS, clean_env, mldist
from mldist.base import progress
from mldist.runtime.watch import jax_watch, stall

STUCK = WORKERS / "jax_stuck.py"
#: The line rank 1 is stuck on: the stall line must name it.
STUCK_LINE = next(i for i, line in enumerate(STUCK.read_text().splitlines(), 1) if "# stuck here" in line)
TIMEOUT = 10


def test_a_sampled_wait_counts_from_its_first_sample_and_a_new_call_starts_again(tmp_path: Path) -> None:
    now = [0.0]
    seen: list[tuple[str, object] | None] = [("JAX computation step across processes", 1)]
    watch = stall.Watch(0, "jax", 10, clock=lambda: now[0], size=2, where=tmp_path, wall=lambda: 1000 + now[0])
    watch.sampler = jax_watch.Waits(lambda frame: seen[0])
    # Rank 1 is where rank 0 is in its collectives, and never in the computation: late.
    progress.write(tmp_path, progress.Record(1, "n2", 9, 0, 0, None, None, ("t.py:3 f: sleep()",), 1000.0))
    assert watch.overdue() is None
    now[0] = 9
    seen[0] = ("JAX computation step across processes", 2)  # the next call: the clock starts again
    assert watch.overdue() is None
    now[0] = 18
    assert watch.overdue() is None
    now[0] = 20
    line = watch.overdue() or ""
    assert "rank 1 has not reached collective #1 JAX computation step across processes after 11 s" in line, line
    assert watch.record(now[0]).current == (1, "JAX computation step across processes", 1009.0)
    seen[0] = None
    assert watch.overdue() is None and watch.record(now[0]).current is None


def test_a_mark_covers_the_sampled_wait_and_one_every_rank_is_in_is_no_stall(tmp_path: Path) -> None:
    now = [0.0]
    watch = stall.Watch(0, "jax", 10, clock=lambda: now[0], size=2, where=tmp_path, wall=lambda: 1000 + now[0])
    watch.sampler = jax_watch.Waits(lambda frame: ("JAX computation step across processes", 1))
    token = watch.begin("allreduce")  # mldist's host collective runs JAX computations itself
    record = watch.record(now[0])
    assert (record.began, record.current) == (1, (1, "allreduce", 1000.0))
    watch.end(token)
    # Rank 1 is in the same computation (its record counts it): a long one, not a stall.
    busy = progress.Record(1, "n2", 9, 2, 1, (2, "JAX computation step across processes", 1000.0), None, (), 1030.0)
    progress.write(tmp_path, busy)
    now[0] = 30
    assert watch.overdue() is None
    assert watch.record(now[0]).began == 2


def test_nothing_is_sampled_without_a_sampler_or_when_it_fails() -> None:
    watch = stall.Watch(0, "jax", 10)
    assert watch.record(0.0).current is None

    def broken(frame: object) -> None:
        raise RuntimeError("a frame changed under the sampler")

    watch.sampler = jax_watch.Waits(broken)
    assert watch.overdue() is None and watch.record(0.0).current is None


def launch(where: str, timeout: int) -> tuple[str, str, float]:
    """Run jax_stuck.py on 2 JAX ranks: (stdout, stderr, seconds from the STUCK line to the end)."""
    env = clean_env(**USERS_GC, MLDIST_COLLECTIVE_TIMEOUT=str(timeout), KERAS_BACKEND="jax")
    res = mldist(["run", "-n", "2", "--no-run-dir", "--", PY, str(STUCK), where], env=env, timeout=180)
    ended = time.time()
    stuck = [float(line.split()[-1]) for line in res.stdout.splitlines() if "STUCK" in line]
    assert res.returncode != 0 and stuck and "END" not in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
    return res.stdout, res.stderr, ended - min(stuck)


@pytest.mark.slow
@pytest.mark.parametrize(
    "where, what",
    [("build", r"jit\(_identity_fn\)"), ("evaluate", "test_step"), ("jit", "<lambda>")],
    ids=["model-building", "evaluate-fast-path", "own-jit-fast-path"],
)
def test_a_rank_stuck_outside_fit_is_named_with_its_line(where: str, what: str) -> None:
    _, err, took = launch(where, TIMEOUT)
    line = re.search(rf"rank 1 has not reached collective #\d+ JAX computation {what} across processes after .*", err)
    assert line, err[-3000:]
    assert f"jax_stuck.py:{STUCK_LINE} stop: time.sleep(600)" in line.group(0), line.group(0)
    assert f"MLDIST_COLLECTIVE_TIMEOUT={TIMEOUT}" in err, err[-3000:]
    # The launcher names the rank that ended first: rank 0 after its line, or the stuck rank 1 itself when
    # JAX's client there loses rank 0's coordinator and aborts first (seen once under load).
    ended = ("rank 0 exited with code 1", "rank 1 was killed by SIGABRT")
    assert any(e in err for e in ended), err[-3000:]
    assert took < TIMEOUT + 25, f"the job ended {took:.0f} s after rank 1 stopped\n{err[-3000:]}"


@pytest.mark.slow
def test_a_rank_waiting_briefly_in_each_call_is_no_stall() -> None:
    env = clean_env(**USERS_GC, MLDIST_COLLECTIVE_TIMEOUT="4", KERAS_BACKEND="jax")
    res = mldist(["run", "-n", "2", "--no-run-dir", "--", PY, str(STUCK), "nowhere"], env=env, timeout=180)
    assert res.returncode == 0 and res.stdout.count("END") == 2, res.stdout[-2000:] + res.stderr[-3000:]
    assert "has not reached collective" not in res.stderr
