"""A stalled collective ends the job with one line, instead of a silent hang.

Every collective mldist issues marks its start and end (the MPI engine inside its
``numpy_function``; TensorFlow's engines by adding one to a "started" and a "finished"
counter, two CPU variables, before and after the collective op). A daemon thread
publishes where this rank is about once a second (:mod:`mldist.base.progress`) and looks
for a collective in flight longer than ``MLDIST_COLLECTIVE_TIMEOUT`` seconds (default
:data:`DEFAULT_TIMEOUT`, 0 turns the watch off); then it ends the process, exit code
:data:`STALL_EXIT_CODE`, naming each rank that never reached the collective and where it
is (from the others' records), or, when all reached it, this rank, the engine, the
collective, the seconds waited and the fallback (for NCCL: ``MLDIST_COMMUNICATION=ring``).

TensorFlow's own collective timeout is left unset on purpose: small values time out
healthy steps, and a dead peer already fails a collective after about 9 s (heartbeat).
The watch is for the other case: every peer alive and one collective never finishing.

Example:
    >>> stall_message(1, "nccl", "allreduce(sum)", 612.0, 600.0)[:46]
    'rank 1 waited 612 s in allreduce(sum) (engine '
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any, cast

from ...base import envvalues, hosts, nodes, processwide, progress
from ..context import STATE
from . import stall_lines, straggler, straggler_rounds, verdict
from .frames import main_thread_frame, main_thread_frames
from .leave import error_line, leave, tell
from .stall_lines import HINTS as HINTS
from .stall_lines import RAISE_IT as RAISE_IT
from .stall_lines import collective_timeout as collective_timeout
from .stall_lines import late_message as late_message
from .stall_lines import stall_message as stall_message

#: Seconds a collective may take before the watch ends the job: far above any sane step,
#: short enough that a stalled job gives its allocation back.
DEFAULT_TIMEOUT = envvalues.COLLECTIVE_TIMEOUT.default
#: Exit code of a rank the watch ended.
STALL_EXIT_CODE = 1
_CHECK_SECONDS = 1.0
#: After this many records in a row that could not be made, the rank says so (once).
FAILURES_SAID = 5
#: How many of its last collectives' waits a record carries for rank 0's slow-rank account
#: (:mod:`mldist.runtime.watch.straggler_watch`); the rest of the history stays in the watch.
PUBLISHED_WAITS = straggler.KEPT


#: Counters read from the graph: (collectives started, finished, index of the last started in its names).
Probe = Callable[[], tuple[int, int, int]]
#: (the main thread's innermost frame, now, now on the wall) -> (the collective it waits in, since, since
#: on the wall), or None: waits nothing marks (:class:`mldist.runtime.watch.jax_watch.Waits`).
Sampler = Callable[[FrameType | None, float, float], "tuple[str, float, float] | None"]


class RecordedWaits:
    """A watcher of the watch: this rank's last :data:`PUBLISHED_WAITS` collective waits, which its progress
    records carry where rank 0's slow-rank account reads them there (RING, NCCL; :class:`Watch`'s ``record``).

    Example:
        >>> kept = RecordedWaits(2)
        >>> for number in (1, 2, 3): kept.ended((number, 0.5, 0.1))
        >>> kept.kept()
        ((2, 0.5, 0.1), (3, 0.5, 0.1))
    """

    def __init__(self, count: int = PUBLISHED_WAITS) -> None:
        self._kept: collections.deque[straggler.Entry] = collections.deque(maxlen=count)

    def ended(self, entry: straggler.Entry) -> None:
        """Keep the wait of a collective that ended (called with the watch's lock held)."""
        self._kept.append(entry)

    def turn(self, watch: Any) -> None:
        """Nothing: the watch's records carry them."""

    def kept(self) -> tuple[straggler.Entry, ...]:
        """The waits kept, oldest first."""
        return tuple(self._kept)


class Watch:
    """Collectives in flight on this rank and the thread that ends the process when one stalls.

    Marks come from Python (:meth:`begin`/:meth:`end`, the MPI and JAX engines, Keras's steps) or
    from graph counters that ``probe`` reads (TensorFlow's engines): started != finished means
    one is in flight, since the counters last changed. Collectives are numbered in the order
    they begin, alike on every rank; about once a second the watch publishes where this rank is
    (:mod:`mldist.base.progress`), and a stall names the ranks that never reached the collective.

    Args:
        rank, engine: named in the message.
        timeout: seconds (> 0).
        probe: reads the graph counters, or None.
        names: what each index the probe returns stands for (appended to while tracing).
        clock: the time source for durations (tests pass a fake one).
        size: the number of ranks.
        where: the progress folder (None: nothing published, nothing read).
        wall: the time source for published times (seconds since the epoch).
        sampler: says when the main thread waits in a collective nothing marks; counted where no mark
            covers it, as the next collective (a sampled one every rank is in is no stall: it may be long).
        host: this node's name (default: this host's); local: its node-local folder (default:
            :func:`mldist.base.nodes.local_folder` of ``where``). The benchmark simulates nodes with them.
    """

    def __init__(
        self,
        rank: int,
        engine: str,
        timeout: float,
        probe: Probe | None = None,
        names: Sequence[str] = (),
        clock: Any = time.monotonic,
        *,
        size: int = 1,
        where: Path | None = None,
        wall: Callable[[], float] = time.time,
        sampler: Sampler | None = None,
        host: str | None = None,
        local: Path | None = None,
    ) -> None:
        self.rank, self.engine, self.timeout, self._clock = rank, engine, timeout, clock
        self.probe, self.names, self.size, self.where, self._wall = probe, names, size, where, wall
        self._flight: dict[int, tuple[str, float, float]] = {}  # token -> (what, since, since on the wall)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] = (0, 0, 0)
        self._since, self._since_wall = 0.0, 0.0
        self._began = self._finished = 0  # collectives marked from Python
        self._last: tuple[str, float] | None = None  # the last one finished (Python marks), and when
        #: Records written before this watch started are an earlier attempt's (a reused run directory).
        self.every = progress.interval(size)
        self._born = self._wall() - 2 * self.every
        self._published = float("-inf")
        self._publishing = threading.Lock()
        self._failed = 0  # records in a row that could not be made
        self.sampler = sampler
        self.host = hosts.hostname() if host is None else host
        self.node: nodes.Node | None = None
        self.verdicts: verdict.Verdicts | None = None
        if where is not None:
            local = nodes.local_folder(where) if local is None else local
            self.node = nodes.Node(where, local, self.host)
            self.verdicts = verdict.Verdicts(where, local, rank, self._born, wall)
        self._judged: tuple[int, float] | None = None  # a sampled wait every rank is in: judged once
        self._ended: float | None = None  # when the last collective ended (a wait's gap starts there)
        #: Fit's steps, and the watchers registered with this watch: each is told of every collective that ends
        #: and turns with this thread (the slow-rank account: :func:`mldist.runtime.watch.straggler_rounds.watchers`,
        #: and :class:`RecordedWaits` where the records carry the waits). The watch keeps none of their state.
        self.steps, self.watchers = 0, cast("list[straggler_rounds.Watcher]", [])

    def begin(self, what: str) -> int:
        """Mark a collective as started; the token to pass to :meth:`end`."""
        token = next(self._ids)
        with self._lock:
            self._began += 1
            self._flight[token] = (what, self._clock(), self._wall())
        return token

    def end(self, token: int) -> None:
        """Mark the collective of ``token`` as finished."""
        now = self._clock()
        with self._lock:
            done = self._flight.pop(token, None)
            if done is not None:
                self._finished += 1
                self._last = (done[0], self._wall())
                if self.watchers:
                    entry = straggler.entry(token, done[1], self._ended, now)
                    for watcher in self.watchers:
                        watcher.ended(entry)
                self._ended = now
        # Where the watch thread is starved (it publishes every second), the thread that ran the
        # collective publishes: off the hot path otherwise, and a record is never far behind.
        if now - self._published > 2 * self.every:
            self.publish()

    def _probed(self, now: float) -> tuple[str, float, float] | None:
        """The graph's collective in flight and since when, from the counters."""
        if self.probe is None:
            return None
        counts = self.probe()
        if counts != self._seen:
            self._seen, self._since, self._since_wall = counts, now, self._wall()
        started, finished, index = counts
        if started == finished:
            return None
        return (self._name(index), self._since, self._since_wall)

    def _sampled(self, now: float, covered: bool) -> tuple[str, float, float] | None:
        """The sampler's wait, where no mark covers it (one does: nothing is read, and the sampler lets go)."""
        if self.sampler is None:
            return None
        try:
            return self.sampler(None if covered else main_thread_frame(), now, self._wall())
        except Exception:  # another thread's frames can change under the sampler: the next sample decides
            return None

    def _name(self, index: int) -> str:
        return self.names[index] if 0 <= index < len(self.names) else "a collective"

    def record(self, now: float) -> progress.Record:
        """Where this rank is now, for the others (collective numbers count Python marks and graph counters)."""
        probed = self._probed(now)
        with self._lock:
            marks = list(self._flight.values())
            began, finished, last = self._began + self._seen[0], self._finished + self._seen[1], self._last
            kept = next((w.kept() for w in self.watchers if isinstance(w, RecordedWaits)), ())
        if (sampled := self._sampled(now, bool(marks) or probed is not None)) is not None:
            began, marks = began + 1, [sampled]
        oldest = min([*marks, *([probed] if probed else [])], key=lambda item: item[1], default=None)
        if self._seen[1] and (last is None or self._since_wall > last[1]) and self._seen[0] == self._seen[1]:
            last = (self._name(self._seen[2]), self._since_wall)  # the graph's last collective ended last
        return progress.Record(
            rank=self.rank,
            host=self.host,
            pid=os.getpid(),
            began=began,
            finished=finished,
            current=(began, oldest[0], oldest[2]) if oldest else None,
            last=(finished, *last) if last and finished else None,
            stack=main_thread_frames(),
            written=self._wall(),
            every=self.every,
            waits=tuple((n, round(w, 6), round(g, 6)) for n, w, g in kept),
        )

    def publish(self) -> None:
        """Write this rank's record into the progress folder (if any); a failure is said once, then left."""
        where, node = self.where, self.node
        if where is None or node is None or not self._publishing.acquire(blocking=False):
            return  # off, or the other thread is at it
        try:
            self._published = now = self._clock()
            record = self.record(now)
            node.publish(self.rank, asdict(record), record.written)
            self._failed = 0
        except OSError as exc:
            name = exc.filename or where
            tell(error_line(f"cannot write progress to {name} ({exc.strerror}); a stall will name no late rank"))
            self.where = None
        except Exception as exc:  # reading another thread's frames must never end the watch
            self._failed += 1  # a frame caught between two lines: the next record, a second later, is fine
            if self._failed == FAILURES_SAID:
                tell(error_line(f"cannot record this rank's progress ({type(exc).__name__}: {exc}); still trying"))
        finally:
            self._publishing.release()

    def overdue(self) -> str | None:
        """The message for the oldest collective in flight past the timeout, else None."""
        now = self._clock()
        probed = self._probed(now)
        with self._lock:
            marks = list(self._flight.values())
            began = self._began + self._seen[0]
        if alone := (sampled := self._sampled(now, bool(marks) or probed is not None)) is not None:
            began, marks = began + 1, [sampled]
        oldest = min([*marks, *([probed] if probed else [])], key=lambda item: item[1], default=None)
        if oldest is None or now - oldest[1] <= self.timeout or self._judged == (began, oldest[2]):
            return None  # in time, or a sampled wait every rank was found in (a long one: no stall)
        waited = now - oldest[1]
        late = self._late(began, oldest[0], oldest[2], waited)
        if late is None:
            return None  # the verdict is on its way
        if not late:
            if alone:
                self._judged = (began, oldest[2])
                return None
            return stall_message(self.rank, self.engine, oldest[0], waited, self.timeout)
        return late_message(self.rank, self.engine, late, waited, self.timeout)

    def _late(self, number: int, what: str, since: float, waited: float) -> list[str] | None:
        """The lines naming the ranks late for collective ``number``: one rank reads the records, the others
        take its verdict (:mod:`mldist.runtime.watch.verdict`); None while the verdict is on its way."""

        def judge() -> list[str]:
            found = progress.read(self.where) if self.where is not None else {}
            records = {r: record for r, record in found.items() if record.written >= self._born}
            return stall_lines.late_lines(self.rank, number, what, waited, records, self.size, self.where, self._wall())

        if self.verdicts is None:
            return judge()
        return self.verdicts.ask(number, since, judge)

    def run(self) -> None:
        """The daemon thread's loop: check about once a second, publish every :attr:`every`, end on a stall."""
        while True:
            time.sleep(min(_CHECK_SECONDS, self.timeout / 4))
            if self._clock() - self._published >= self.every - _CHECK_SECONDS / 2:
                self.publish()
            for watcher in self.watchers:
                watcher.turn(self)
            if message := self.overdue():
                end_process(message)


def end_process(message: str) -> None:
    """End this rank with ``message`` through the runtime's one exit path (MPI engine: abort the job)."""
    leave(message, STALL_EXIT_CODE)


def start(
    rank: int,
    engine: str,
    env: Mapping[str, str],
    probe: Probe | None = None,
    names: Sequence[str] = (),
    size: int = 1,
    timeout: float | None = None,
) -> Watch | None:
    """Start the watch for this rank (``init`` does, with 2+ workers); None when turned off.

    Args:
        rank, engine: named in the message.
        env: for the progress folder (:func:`mldist.base.progress.folder`), and ``MLDIST_COLLECTIVE_TIMEOUT``
            when ``timeout`` is not given.
        probe, names: the engine's graph counters and what their indices name (see :class:`Watch`).
        size: the number of ranks.
        timeout: seconds (``init`` passes the value it read once; None: the context's, else ``env``'s).
    """
    if timeout is None:  # init's value, read once into the context; else (a caller before init) env's
        timeout = STATE.settings.collective_timeout if STATE.settings is not None else collective_timeout(env)
    if STATE.watch is None and timeout > 0:
        watch = Watch(rank, engine, timeout, probe, names, size=size, where=progress.folder(env), sampler=STATE.sampler)
        watch.publish()  # at once: a rank may be stuck before the thread's first turn
        watch.watchers = straggler_rounds.watchers(rank, size, env, watch._born, watch.every)
        records = not getattr(STATE.engine, "gathers_aside", False)  # RING, NCCL: rank 0 reads every rank's records
        if size > 1 and records and envvalues.STRAGGLER_PERCENT.read(env) > 0:  # elsewhere no one reads waits there
            watch.watchers.insert(0, RecordedWaits())
        if watch.node is not None:  # node-local memory is freed at exit (the node's file too, in a temporary folder)
            processwide.at_exit("atexit: the node's records freed", watch.node.forget, rank, progress.temporary(env))
        STATE.watch = watch  # the worker's context owns it (mldist.runtime.context.STATE)
        threading.Thread(target=watch.run, name="mldist-collective-watch", daemon=True).start()
    return cast("Watch | None", STATE.watch)


def sample_with(sampler: Sampler) -> None:
    """Count the main thread as in a collective while ``sampler`` says so (the JAX engine's ``start``)."""
    STATE.sampler = sampler
    if STATE.watch is not None:
        STATE.watch.sampler = sampler


def begin(what: str) -> int:
    """Mark a collective as started (0 when the watch is off); cheap: a lock and a dict entry."""
    return watch.begin(what) if (watch := STATE.watch) is not None else 0  # type: ignore[no-any-return]


def end(token: int) -> None:
    """Mark the collective of ``token`` as finished."""
    if (watch := STATE.watch) is not None:
        watch.end(token)


@contextlib.contextmanager
def stall_watch(what: str = "a training step") -> Iterator[None]:
    """Count the block as one collective for the stall watch: a custom loop's compiled step.

    Keras's ``fit`` steps count already (``mldist.keras.StallWatch``). A JAX or compiled
    TensorFlow step of your own all-reduces inside XLA, where mldist sees nothing: wrap the
    step and what waits for its result, so a rank that never arrives is named after
    ``MLDIST_COLLECTIVE_TIMEOUT``. Every rank must wrap the same steps (they are numbered).

    Args:
        what: how stall lines and ``mldist stacks`` name it.

    Example::

        with mldist.stall_watch("train step"):
            state, loss = train_step(state, batch)
            jax.block_until_ready(loss)   # JAX returns at once; the wait is here
    """
    token = begin(what)
    try:
        yield
    finally:
        end(token)


def step() -> None:
    """Count one training step (Keras's ``fit``, through ``StallWatch``): the slow-rank line's cost per step."""
    if (watch := STATE.watch) is not None:
        watch.steps += 1


def active() -> bool:
    """Whether collectives are being watched (graph markers are only built then)."""
    return STATE.watch is not None
