"""The slow-rank account as watchers of the collective watch: every rank's rounds, rank 0's account.

:func:`watchers` gives the collective watch (:class:`mldist.runtime.watch.stall.Watch`) what it tells of each
collective that ends (:meth:`Watcher.ended`) and turns with its thread about once a second
(:meth:`Watcher.turn`). Where the engine can gather a small row from every rank beside its collectives
(its ``gathers_aside`` flag; :mod:`mldist.runtime.watch.straggler_gather`), each rank is a :class:`Reporter`:
it picks its collectives' waits and posts them once a second, and rank 0's reporter feeds its
:class:`mldist.runtime.watch.straggler_watch.Tracker`, which says the line. No file is read: rank 0's cost a
second is bounded (:data:`mldist.runtime.watch.straggler_gather.ROUND_VALUES`) at any number of ranks. Other
engines keep rank 0 reading the progress records (:class:`Records`).

Example:
    >>> watchers(1, 2, {"MLDIST_STRAGGLER_PERCENT": "0"}, 0.0, 1.0)
    []
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from ...base import envvalues, hosts, processwide
from ..context import STATE
from .straggler import Entry, frame_of
from .straggler_gather import LAST, ROUND_SECONDS, Aside, Picker, row, slots
from .straggler_watch import Tracker, tracker

#: At exit, rank 0 waits at most this long for every rank's last round (seconds).
LAST_ROUND_SECONDS = 3.0


class Watcher(Protocol):
    """What the collective watch tells and turns (:class:`mldist.runtime.watch.stall.Watch`'s ``watchers``)."""

    def ended(self, entry: Entry) -> None:
        """A collective ended on this rank (called with the watch's lock held: cheap, never blocking)."""
        ...

    def turn(self, watch: Any) -> None:
        """The watch thread's turn, about once a second."""
        ...


class Records:
    """Rank 0's account from the progress records (engines that cannot gather beside their collectives)."""

    def __init__(self, found: Tracker) -> None:
        self.tracker = found

    def ended(self, entry: Entry) -> None:
        """Nothing: the records carry the waits."""

    def turn(self, watch: Any) -> None:
        """Read the records when due (:meth:`Tracker.turn`)."""
        if watch.where is not None:
            self.tracker.turn(watch.where, watch.steps)


class Reporter:
    """One rank's part in the rounds: pick, post once a second; at rank 0, collect and account.

    Args:
        aside: the engine's channel (:class:`mldist.runtime.watch.straggler_gather.Aside`).
        rank, size: this rank and the number of ranks.
        host: this rank's host, as the line names it.
        found: rank 0's tracker (None elsewhere).
        every: seconds between rounds.
    """

    def __init__(
        self, aside: Aside, rank: int, size: int, host: str, found: Tracker | None = None, every: float = ROUND_SECONDS
    ) -> None:
        self.aside, self.rank, self.size, self.host, self.tracker, self.every = aside, rank, size, host, found, every
        self.picker = Picker(slots(size) // getattr(aside, "repeats", 1))
        self._previous: list[Entry] = []
        self._frames: collections.Counter[str] = collections.Counter()
        self._next, self._stopped = 0.0, False
        #: At rank 0, the ranks whose last round (:data:`LAST`) came in, whenever it did.
        self._ended = np.zeros(size if found is not None else 0, bool)
        self._lock = threading.Lock()  # the watch thread's turn and the exit handler: one at a time

    def ended(self, entry: Entry) -> None:
        """Pick the collective when its number is one this round keeps."""
        self.picker.ended(entry)

    def turn(self, watch: Any, now: float | None = None) -> None:
        """Post this rank's round when due; rank 0 takes in the rounds that came back."""
        now = time.time() if now is None else now
        if now < self._next or self._stopped:
            return
        self._next = now + self.every
        with self._lock:
            if self._stopped:  # finish ran while this turn waited for the lock
                return
            try:
                self._frame(watch)
                self._round(watch.steps, now)
            except Exception as exc:  # the account must never end the stall watch that runs it
                self._stop(exc)

    def _frame(self, watch: Any) -> None:
        """Count where the main thread is, when it is outside collectives (the line says the most frequent), in
        a second that ended collectives: imports, set-up and the first step's tracing are not where steps go."""
        if self.picker.count and (frame := frame_of(watch.record(time.monotonic()))):
            self._frames[frame] += 1

    def _round(self, steps: int, now: float, last: bool = False) -> None:
        picked = self.picker.take()
        sent = self._previous + picked if getattr(self.aside, "repeats", 1) > 1 else picked
        self._previous = picked
        frame = self._frames.most_common(1)[0][0] if self._frames else ""
        if self.tracker is not None:
            self.tracker.own(self.rank, picked)  # rank 0's own waits need not travel
        self.aside.post(row(self.host, frame, sent, self.size, last))
        if self.tracker is not None:
            self._account(self.aside.collect(), steps, now)

    def _account(self, rounds: list[Any], steps: int, now: float) -> None:
        found = self.tracker
        assert found is not None
        for got in rounds:
            self._ended |= got[:, LAST] > 0
        found.note(steps, now)
        finding = found.take(rounds, steps, now, mine=self.rank)
        if finding is not None and found.said is None:
            found.said = finding
            found.say(finding, now)

    def _stop(self, exc: Exception) -> None:
        self._stopped = True
        print(f"mldist: the slow-rank account stopped ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)

    def finish(self) -> None:
        """At exit: post the last round; rank 0 waits for every rank's (a few seconds at most), then says the
        line over the whole run if the window never filled (:meth:`Tracker.finish`)."""
        if self._stopped:
            return
        if not self._lock.acquire(timeout=5):  # a turn stuck in the engine: let no other one start
            self._stopped = True
            return
        try:
            steps = self.tracker._last_steps if self.tracker is not None else 0
            self._round(steps, time.time(), last=True)
            if self.tracker is not None:
                self._last_rounds()
        except Exception as exc:  # at exit, with the libraries half torn down: one line, never a traceback
            self._stop(exc)
        finally:
            # No post after the last one: the watch thread's next turn would call the engine while the
            # interpreter ends, and JAX's client (C++) then aborts the rank ("exception not rethrown").
            self._stopped = True
            self._lock.release()
        if self.tracker is not None:
            self.tracker.finish()

    def _last_rounds(self) -> None:
        """Rank 0 at exit: take rounds until every other rank's last one came (posting empty ones it needs).

        A last round may have come already (ranks that end together: with this rank's own last post), and
        none can come once nothing this rank posted is still open: then it waits no longer.
        """
        found = self.tracker
        assert found is not None
        self._ended[self.rank] = True
        until, posted = time.monotonic() + LAST_ROUND_SECONDS, 0
        while not self._ended.all() and time.monotonic() < until:
            rounds = self.aside.collect(wait=0.2)
            for got in rounds:
                self._ended |= got[:, LAST] > 0
            found.take(rounds, found._last_steps, found._last_turn, mine=self.rank)
            if not rounds and posted < 2:  # another rank posted more rounds than this one: match them
                self.aside.post(row(self.host, "", [], self.size))
                posted += 1
            elif not rounds and not self.aside.waiting():
                return


def watchers(rank: int, size: int, env: Mapping[str, str], born: float, every: float) -> list[Watcher]:
    """The slow-rank account's watchers for this rank: none with one rank or the line turned off.

    The engine decides how the waits reach rank 0: its rounds where it ``gathers_aside``, else the
    progress records (rank 0's :class:`Records`).
    """
    if size < 2 or envvalues.STRAGGLER_PERCENT.read(env) <= 0:
        return []
    engine = STATE.engine
    if not getattr(engine, "gathers_aside", False):
        found = tracker(rank, size, env, born, every)
        return [Records(found)] if found is not None else []
    account = tracker(rank, size, env, born, every) if rank == 0 else None
    reporter = Reporter(engine.aside(rank, size), rank, size, hosts.hostname(), account)
    processwide.at_exit("atexit: the slow-rank reporter", reporter.finish)  # after the tracker's: runs first
    return [reporter]
