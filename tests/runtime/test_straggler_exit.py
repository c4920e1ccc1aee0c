"""Rank 0's slow-rank reporter at exit (mldist.runtime.watch.straggler_rounds.Reporter.finish): it waits for
the other ranks' last rounds only while one can still come, so a job whose ranks end together ends at once.

The channel here matches posts as ``MPI_Igather`` does (:class:`mldist.runtime.watch.straggler_gather.MpiAside`):
rank 0's k-th post completes when every other rank posted its k-th row.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mldist.runtime.watch import straggler_rounds, straggler_watch
from mldist.runtime.watch.straggler_gather import row


class Igathers:
    """Rank 0's side of the rounds: its posts, matched in order with the rows ``others`` posted."""

    def __init__(self, others: list[list[bool]]) -> None:
        # Each other rank's rows in order, True for its last round.
        self.others = [
            [row(f"h{r + 1}", "", [], len(others) + 1, last) for last in rows] for r, rows in enumerate(others)
        ]
        self.mine: list[np.ndarray[Any, Any]] = []
        self.taken, self.collects = 0, 0

    def post(self, values: np.ndarray[Any, Any]) -> None:
        self.mine.append(values)

    def _complete(self) -> bool:
        return self.taken < len(self.mine) and all(len(rows) > self.taken for rows in self.others)

    def collect(self, wait: float = 0.0) -> list[np.ndarray[Any, Any]]:
        self.collects += 1
        done = []
        while self._complete():
            done.append(np.stack([self.mine[self.taken], *(rows[self.taken] for rows in self.others)]))
            self.taken += 1
        if not done and self.waiting():  # an open round: MpiAside polls it up to ``wait``
            time.sleep(wait)
        return done

    def waiting(self) -> bool:
        return self.taken < len(self.mine)


def _finish(others: list[list[bool]], turns: int) -> tuple[float, Igathers]:
    """Rank 0 of ``len(others) + 1`` ranks posts ``turns`` rounds, then exits; the seconds its finish took."""
    channel = Igathers(others)
    size = len(others) + 1
    reporter = straggler_rounds.Reporter(channel, 0, size, "h0", straggler_watch.Tracker(size, 10, 30, plot=False))
    for t in range(turns):
        reporter._round(steps=t, now=float(t))
    started = time.monotonic()
    reporter.finish()
    return time.monotonic() - started, channel


def test_ranks_that_end_together_are_not_waited_for() -> None:
    """Every rank posted one round and its last: rank 0's own last post brings the others' last rows."""
    took, channel = _finish([[False, True], [False, True]], turns=1)
    assert took < 1.0, f"rank 0 waited {took:.1f} s for last rounds that had come"  # 3 s before
    assert channel.taken == 2


def test_a_rank_that_posted_more_rounds_is_matched_and_not_waited_for() -> None:
    took, channel = _finish([[False, False, True], [False, False, True]], turns=1)
    assert took < 1.0 and channel.taken == 3  # one empty post of rank 0's matched their third


def test_last_rounds_taken_during_the_run_count_and_nothing_spins_when_none_can_come() -> None:
    """Rank 0 posted more than the others, whose last rows came with one of its earlier rounds: no post of its
    own is open at exit after two empty ones, so it stops asking (before: it asked in a busy loop for 3 s)."""
    took, channel = _finish([[False, True], [False, True]], turns=3)
    assert took < 1.0, f"took {took:.1f} s"
    assert channel.collects < 50, channel.collects


def test_a_rank_that_never_posts_its_last_round_is_waited_for_3_s_at_most() -> None:
    took, channel = _finish([[False, True], [False]], turns=1)
    assert straggler_rounds.LAST_ROUND_SECONDS - 0.5 < took < straggler_rounds.LAST_ROUND_SECONDS + 2
    assert channel.collects < 50, channel.collects  # it polls its open rounds, it does not spin


class Counting:
    """A channel that counts its posts (any rank but 0: nothing to collect)."""

    def __init__(self) -> None:
        self.posts = 0

    def post(self, values: np.ndarray[Any, Any]) -> None:
        self.posts += 1

    def collect(self, wait: float = 0.0) -> list[np.ndarray[Any, Any]]:
        return []

    def waiting(self) -> bool:
        return False


class Watch:
    steps = 3

    def record(self, now: float) -> None:
        return None


def test_after_its_last_round_a_rank_posts_no_more() -> None:
    """The watch thread turns on while exit handlers run (JAX's shutdown barrier): a post then reached JAX's
    client as the interpreter ended, which aborted rank 1 with "FATAL: exception not rethrown"."""
    channel = Counting()
    reporter = straggler_rounds.Reporter(channel, 1, 2, "h1")
    reporter.turn(Watch(), now=1.0)
    reporter.finish()
    assert channel.posts == 2  # a round, and the last one
    reporter.turn(Watch(), now=100.0)
    reporter.finish()
    assert channel.posts == 2
