"""Rank 0's slow-rank account (:mod:`mldist.runtime.watch.straggler` computes it): its line, file and picture.

Rank 0's collective watch thread feeds :class:`Tracker` every record about once a second; the
first finding is printed once, kept in ``straggler.json`` in the run directory (``mldist status``
shows it, :func:`status`) and drawn in ``straggler.png``, each rank's wait per step (also at exit).

Example:
    >>> Tracker(2, 10, 30).said is None, status("/nonexistent")
    (True, '')
"""

from __future__ import annotations

import collections
import io
import itertools
import json
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ...base import envvalues, processwide, progress, rundir
from ...base.files import atomic_write
from . import straggler
from .straggler import KEPT, Entry, Finding, Sample, find, find_in_run, frame_of, message, sample, samples_of
from .straggler_gather import COUNT, HOST_VALUES, Pool, scaled, slots, text_of

#: Rank 0 reads about this many records a second at most (a shared file system's metadata server).
READS_PER_SECOND = 64
#: In the run directory: the line and its numbers (``mldist status``), and the picture.
FILE, PICTURE = "straggler.json", "straggler.png"
#: How often rank 0 looks for a lasting slow rank (seconds): a line minutes in the making (``straggler.find_lasting``).
LASTING_EVERY = 5.0
#: The picture's lines, at most (the ranks that waited least: the likely slow ones).
DRAWN = 16
#: How many turns the picture keeps (about one a second), and how many ranks' waits in all (4,000 turns up to
#: 1,000 ranks, 244 at 16,384: a picture's worth of memory).
BINS, BIN_VALUES = 4000, 4_000_000


def bins_kept(size: int) -> int:
    """How many turns the picture keeps for ``size`` ranks.

    Example:
        >>> bins_kept(2), bins_kept(16384)
        (4000, 244)
    """
    return max(16, min(BINS, BIN_VALUES // max(1, size)))


class _Where(Mapping[int, str]):
    """Each rank's most frequent line outside collectives, looked up only for the rank named."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker

    def __getitem__(self, rank: int) -> str:
        found = self.tracker._line_of(rank)
        if not found:
            raise KeyError(rank)
        return found

    def __len__(self) -> int:
        return self.tracker.size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.tracker.size))


class Tracker:
    """Rank 0's running account of who arrives last (its watch thread calls :meth:`turn`).

    Args:
        size: the number of ranks.
        percent, seconds: the thresholds.
        born: records written before this are an earlier attempt's.
        run_dir: where the line's record and the picture go (None: nowhere).
        plot: whether to draw the picture.
        every: how often the ranks publish (seconds).
    """

    def __init__(
        self,
        size: int,
        percent: float,
        seconds: float,
        born: float = 0.0,
        run_dir: Path | None = None,
        plot: bool = True,
        every: float = progress.PUBLISH_SECONDS,
    ) -> None:
        self.size, self.percent, self.seconds, self.born = size, percent, seconds, born
        self.run_dir, self.plot = run_dir, plot
        self.period = max(every, size / READS_PER_SECOND)
        self._pending: dict[int, dict[int, tuple[float, float]]] = {}
        self._upto = 0  # collectives up to this number are paired (ranks publish them in order)
        self.stamped: collections.deque[tuple[float, Sample]] = collections.deque()
        self._steps: collections.deque[tuple[float, int]] = collections.deque()
        self._frames: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self._seen: dict[int, float] = {}
        self.hosts: dict[int, str] = {}
        #: Per turn: (when, steps so far, each rank's seconds waited in the collectives paired then); fewer turns
        #: at thousands of ranks (a picture's worth of memory, :data:`BIN_VALUES`).
        self.bins: collections.deque[tuple[float, int, Any]] = collections.deque(maxlen=bins_kept(size))
        # The rounds' account (straggler_gather): the collectives waiting for every rank, each rank's host
        # (an index into the names) and each rank's line in the last round.
        self._pool = Pool(size, slots(size))
        self._node: Any = None
        self._names: list[str] = []
        self._heads_rows: Any = None
        self._early: list[Sample] = []  # paired as rank 0 added its own entries: stamped at the next turn
        self.said: Finding | None = None
        self._next, self._next_lasting = 0.0, 0.0
        self.kept = (straggler.LASTING_WINDOWS + 1) * seconds  # the seconds of collectives kept
        #: What :meth:`finish` needs at exit: the progress folder, the steps at the first and the last turn,
        #: and when the last turn was.
        self._where: Path | None = None
        self._first_steps: int | None = None
        self._last_steps, self._last_turn = 0, 0.0
        # The watch thread turns while rank 0's exit handlers run (finish): one at a time, and finish once.
        self._lock, self._finished = threading.Lock(), False

    def add(self, records: Mapping[int, progress.Record], steps: int, now: float) -> Finding | None:
        """Take in every rank's record; the finding, when the thresholds are passed now.

        Example:
            >>> t = Tracker(2, 10, 30)
            >>> rec = lambda r, w: progress.Record(r, f"n{r}", 1, 5, 5, None, None, (), 1.0, waits=((5, w, 0.3),))
            >>> t.add({0: rec(0, 0.25), 1: rec(1, 0.01)}, 1, now=100.0) is None, t.stamped[0][1].last
            (True, 1)
        """
        records = {r: record for r, record in records.items() if r < self.size}
        for r, record in records.items():
            self.hosts[r] = record.host
            if self._seen.get(r) != record.written:
                self._seen[r] = record.written
                if frame := frame_of(record):
                    self._frames[r][frame] += 1
            for number, wait, gap in record.waits:
                if number > self._upto:  # a record repeats its rank's last KEPT collectives: pair each once
                    self._pending.setdefault(number, {})[r] = (wait, gap)
        done = sorted(n for n, found in self._pending.items() if len(found) >= self.size)
        self._upto = max([self._upto, *done])
        samples = [sample(number, self._pending.pop(number), self.hosts) for number in done]
        # A collective some rank no longer publishes (or never will: no record of it here) will never pair.
        if self._pending:
            newest = max(self._pending)
            oldest = min((r.waits[0][0] for r in records.values() if r.waits), default=0)
            oldest = oldest if len(records) >= self.size else 0
            for number in [n for n in self._pending if n < max(oldest, self._upto) or n < newest - 4 * KEPT]:
                del self._pending[number]
        waited = [sum(s.waits[r] for s in samples) for r in range(self.size)] if samples else None
        return self._account(samples, waited, steps, now)

    def take(self, rounds: Sequence[Any], steps: int, now: float, mine: int | None = None) -> Finding | None:
        """Take in the rounds rank 0 gathered (:mod:`mldist.runtime.watch.straggler_gather`: ranks x values each);
        the finding, when the thresholds are passed now. ``mine``: the rank whose entries came through :meth:`own`.

        Example:
            >>> from mldist.runtime.watch.straggler_gather import row
            >>> t = Tracker(2, 10, 30)
            >>> rows = np.stack([row("n0", "", [(5, 0.25, 0.3)], 2), row("n1", "", [(5, 0.01, 0.3)], 2)])
            >>> t.take([rows], 1, now=100.0) is None, t.stamped[0][1].last, t.hosts
            (True, 1, {0: 'n0', 1: 'n1'})
        """
        samples, waited = [], np.zeros(self.size)
        for got in rounds:
            self._learn(got)
            numbers, waits, gaps = self._pool.add(got, mine)
            samples += samples_of(numbers, waits, gaps, self._node, self._names)
            waited += scaled(numbers, waits)
        return self._account(samples, waited if samples else None, steps, now)

    def own(self, rank: int, entries: Sequence[Entry]) -> None:
        """Take this rank's own entries (rank 0's: they need not travel); paired with the next round."""
        numbers, waits, gaps = self._pool.own(rank, entries)
        if len(numbers) and self._node is not None:
            self._early += samples_of(numbers, waits, gaps, self._node, self._names)

    def _learn(self, got: Any) -> None:
        """Each rank's host (from the first round: a rank keeps its host) and its line (from the last)."""
        if self._node is None or len(self._node) != len(got):
            uniq, inverse = np.unique(got[:, :HOST_VALUES], axis=0, return_inverse=True)
            self._names, self._node = [text_of(u) for u in uniq], inverse.reshape(-1)
            self.hosts = {r: self._names[int(i)] for r, i in enumerate(self._node[: self.size])}
        self._heads_rows = got[:, HOST_VALUES:COUNT]

    def _line_of(self, rank: int) -> str:
        """Rank ``rank``'s most frequent line outside collectives, from its last row, or its records."""
        if self._heads_rows is not None and rank < len(self._heads_rows):
            return text_of(self._heads_rows[rank])
        counted = self._frames.get(rank)
        return counted.most_common(1)[0][0] if counted else ""

    def _account(self, samples: list[Sample], waited: Any, steps: int, now: float) -> Finding | None:
        """Stamp ``samples`` (and the picture's bin), keep the window, and look for the finding now."""
        samples, self._early = self._early + samples, []
        self.stamped.extend((now, s) for s in samples)
        if waited is not None:
            self.bins.append((now, steps, np.asarray(waited, np.float32)))
        self._steps.append((now, steps))
        while self.stamped and self.stamped[0][0] < now - self.kept:
            self.stamped.popleft()
        while len(self._steps) > 1 and self._steps[1][0] <= now - straggler.LASTING_WINDOWS * self.seconds:
            self._steps.popleft()
        made = steps - next((n for t, n in reversed(self._steps) if t <= now - self.seconds), self._steps[0][1])
        stamped, where = list(self.stamped), _Where(self)
        found = find(stamped, self.hosts, self.percent, self.seconds, now, made, where)
        if found is None and now >= self._next_lasting:
            self._next_lasting, made = now + LASTING_EVERY, steps - self._steps[0][1]
            found = straggler.find_lasting(stamped, self.hosts, self.percent, self.seconds, now, made, where)
        return found

    def turn(self, where: Path, steps: int, now: float | None = None) -> None:
        """Read the records in ``where`` when due, and say the finding once (rank 0's watch thread)."""
        now = time.time() if now is None else now
        if now < self._next:
            return
        with self._lock:
            self._turn(where, steps, now)

    def _turn(self, where: Path, steps: int, now: float) -> None:
        self._next = now + self.period
        self._where = where
        self.note(steps, now)
        try:
            records = {r: rec for r, rec in progress.read(where).items() if rec.written >= self.born}
            found = self.add(records, steps, now)
            if found is not None and self.said is None:
                self.said = found
                self.say(found, now)
        except Exception as exc:  # the account must never end the stall watch that runs it
            self._next = float("inf")
            print(f"mldist: the slow-rank account stopped ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)

    def at_end(self, now: float) -> Finding | None:
        """The finding over a whole run that ended before the window filled once (None else, or when said).

        A fit shorter than ``MLDIST_STRAGGLER_SECONDS`` never fills the window the line needs while the job
        runs: its slow rank would go unnamed. Rank 0 looks at every collective of the run at its end instead.

        Example:
            >>> t = Tracker(2, 10, 30)
            >>> rec = lambda r, n, w: progress.Record(r, f"n{r}", 1, n, n, None, None, (), 1.0, waits=((n, w, 0.3),))
            >>> for n in range(1, 25):
            ...     _ = t.add({0: rec(0, n, 0.25), 1: rec(1, n, 0.01)}, n, now=100.0 + n / 3)
            >>> t._first_steps, t._last_steps, t._last_turn = 1, 24, 108.0
            >>> t.at_end(109.0).rank
            1
        """
        if self.said is not None or not self.stamped or self._last_turn - self.stamped[0][0] >= self.seconds:
            return None  # said, nothing paired, or the window filled while the job ran: the live line had its turn
        steps = self._last_steps - (self._first_steps or 0)
        return find_in_run([s for _, s in self.stamped], self.hosts, self.percent, steps, _Where(self))

    def note(self, steps: int, now: float) -> None:
        """A turn at ``now`` with ``steps`` made so far: what :meth:`at_end` needs."""
        self._last_steps, self._last_turn = steps, now
        self._first_steps = steps if self._first_steps is None else self._first_steps

    def finish(self) -> None:
        """At exit (rank 0): the line over the whole run when it ended before the window filled, then the picture."""
        if self._finished:
            return
        self._finished = True
        if self._lock.acquire(timeout=5):  # a turn of the watch thread ends first
            try:
                self._finish(time.time())
            except Exception as exc:  # at exit, with the libraries half torn down: one line, never a traceback
                print(f"mldist: the slow-rank account stopped at exit ({type(exc).__name__}: {exc})", file=sys.stderr)
            finally:
                self._lock.release()
        self.draw()

    def _finish(self, now: float) -> None:
        if self.said is not None or self._next == float("inf"):
            return  # said, or stopped on an error
        if self._where is not None:  # the records' account: the last collectives, as of the last turn
            records = {r: rec for r, rec in progress.read(self._where).items() if rec.written >= self.born}
            self.add(records, self._last_steps, self._last_turn)
        found = self.at_end(now)
        if found is not None:
            self.said = found
            self.say(found, now, ended=True)

    def say(self, found: Finding, now: float, ended: bool = False) -> None:
        """Print the line (``ended``: over the whole run, at its end); keep it and draw the picture in the run
        directory (if any)."""
        line = message(found)
        if ended:
            line = f"over the whole run, shorter than MLDIST_STRAGGLER_SECONDS={self.seconds:g}: {line}"
        print(f"mldist: {line}", file=sys.stderr, flush=True)
        if self.run_dir is not None:
            data = {"line": line, "found_unix": round(now, 3), "at_end": ended, **asdict(found)}
            try:
                atomic_write(self.run_dir / FILE, json.dumps(data, indent=1) + "\n", mode=0o644)
            except OSError as exc:
                print(f"mldist: cannot write {self.run_dir / FILE} ({exc.strerror})", file=sys.stderr, flush=True)
        self.draw()

    def draw(self) -> None:
        """Write the picture into the run directory (when there is one, matplotlib and two turns of data)."""
        if self.run_dir is None or not self.plot or len(self.bins) < 2:
            return
        try:
            png = plot_png(list(self.bins), self.said)
            atomic_write(self.run_dir / PICTURE, png, mode=0o644)
        except ImportError:
            pass  # no matplotlib: RunLog already says so for metrics.png
        except OSError as exc:
            print(f"mldist: cannot write {self.run_dir / PICTURE} ({exc.strerror})", file=sys.stderr, flush=True)


def plot_png(bins: Sequence[tuple[float, int, Any]], found: Finding | None = None) -> bytes:
    """A PNG of each rank's wait in collectives per step (per second without steps), over the steps.

    Args:
        bins: (when, steps so far, each rank's seconds waited since the bin before), oldest first.
        found: the finding said (its line is the title), or None.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    by_step = bins[-1][1] > bins[0][1]
    xs, rows = [], []
    for (t0, s0, _), (t1, s1, waited) in itertools.pairwise(bins):
        per = (s1 - s0) if by_step else (t1 - t0)
        if per > 0:
            xs.append(s1 if by_step else t1 - bins[0][0])
            rows.append(1000 * np.asarray(waited, np.float64) / per)
    totals = np.sum(rows, axis=0) if rows else np.zeros(len(bins[-1][2]))
    shown = sorted(np.argsort(totals, kind="stable")[:DRAWN].tolist())
    fig = Figure(figsize=(7.5, 4.2), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for r in shown:
        ax.plot(xs, [row[r] for row in rows], linewidth=1, label=f"rank {r}")
    ax.set_xlabel("step" if by_step else "seconds")
    ax.set_ylabel(f"ms waited in collectives per {'step' if by_step else 'second'}")
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small", ncol=2)
    title = "wait per rank: the rank that waits least arrives last"
    ax.set_title(message(found) if found else title, fontsize="small", wrap=True)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def tracker(rank: int, size: int, env: Mapping[str, str], born: float, every: float) -> Tracker | None:
    """Rank 0's tracker (drawing its picture at exit), or None: another rank, one rank, or turned off.

    Values were checked by ``init`` (:data:`mldist.base.envvalues.WORKER_SETTINGS`).

    Example:
        >>> tracker(1, 2, {}, 0.0, 1.0) is None, tracker(0, 2, {"MLDIST_STRAGGLER_PERCENT": "0"}, 0.0, 1.0)
        (True, None)
    """
    percent = envvalues.STRAGGLER_PERCENT.read(env)
    if rank != 0 or size < 2 or percent <= 0:
        return None
    run_dir = envvalues.RUN_DIR.read(env)
    found = Tracker(
        size,
        percent,
        envvalues.STRAGGLER_SECONDS.read(env),
        born,
        Path(run_dir) if run_dir else None,
        rundir.plot_wanted(env),
        every,
    )
    processwide.at_exit("atexit: the slow-rank tracker", found.finish)
    return found


def status(run_dir: str | Path) -> str:
    """What ``mldist status`` adds for a run whose rank 0 named a slow rank ("" when none).

    Example:
        >>> status("/nonexistent")
        ''
    """
    try:
        data = json.loads((Path(run_dir) / FILE).read_text())
    except (OSError, ValueError):
        return ""
    line = data.get("line") if isinstance(data, dict) else None
    if not isinstance(line, str):
        return ""
    when = data.get("found_unix")
    known = isinstance(when, int | float) and 0 <= when <= 253402300799  # a damaged file's 1e300 would not format
    at = f" (at {progress.clock(when)})" if known else ""
    return f"; slow: {line}{at}"
