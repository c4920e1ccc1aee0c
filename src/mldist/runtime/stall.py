"""A stalled collective ends the job with one line, instead of a silent hang.

Every collective mldist issues marks its start and end (the MPI engine inside its
``numpy_function``; TensorFlow's engines by adding one to a "started" and a "finished"
counter, two CPU variables, before and after the collective op). A daemon thread looks
once a second for a collective in flight longer than ``MLDIST_COLLECTIVE_TIMEOUT``
seconds (default :data:`DEFAULT_TIMEOUT`, 0 turns the watch off) and then ends the
process: one line naming the rank, the engine, the collective, the seconds waited and
the fallback (for NCCL: ``MLDIST_COMMUNICATION=ring``), exit code :data:`STALL_EXIT_CODE`.

TensorFlow's own collective timeout is left unset on purpose: small values time out
healthy steps, and a dead peer already fails a collective after about 9 s (heartbeat).
The watch is for the other case: every peer alive and one collective never finishing.

Example:
    >>> stall_message(1, "nccl", "allreduce(sum)", 612.0, 600.0)[:46]
    'rank 1 waited 612 s in allreduce(sum) (engine '
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from .leave import leave

#: Seconds a collective may take before the watch ends the job: far above any sane step,
#: short enough that a stalled job gives its allocation back.
DEFAULT_TIMEOUT = 600.0
#: Exit code of a rank the watch ended.
STALL_EXIT_CODE = 1
#: What to try next, per engine.
HINTS: Mapping[str, str] = {
    "nccl": "NCCL collectives stall on some clusters (network, driver or NCCL_* settings): "
    "set MLDIST_COMMUNICATION=ring (mldist run --communication ring) to use TensorFlow's RING "
    "collectives instead",
    "ring": "a peer stopped making progress (stuck in its input pipeline or I/O, or running other "
    "steps); check the other ranks' output, or try MLDIST_COMMUNICATION=mpi on CPUs",
    "mpi": "another rank did not reach this collective (stuck, or running other steps); check the "
    "other ranks' output, or try MLDIST_COMMUNICATION=ring",
}
_CHECK_SECONDS = 1.0


def collective_timeout(env: Mapping[str, str]) -> float:
    """Seconds from ``MLDIST_COLLECTIVE_TIMEOUT`` (default :data:`DEFAULT_TIMEOUT`; 0: no watch).

    Example:
        >>> collective_timeout({}), collective_timeout({"MLDIST_COLLECTIVE_TIMEOUT": "0"})
        (600.0, 0.0)
    """
    raw = env.get("MLDIST_COLLECTIVE_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ConfigError(
            f"MLDIST_COLLECTIVE_TIMEOUT={raw!r} is not a number of seconds; set it to e.g. "
            f"{DEFAULT_TIMEOUT:.0f} (the default), or 0 to turn the stalled-collective watch off"
        )
    return seconds


def stall_message(rank: int, engine: str, what: str, seconds: float, timeout: float) -> str:
    """The one line a rank prints before the watch ends it.

    Args:
        rank: this rank.
        engine: "nccl", "ring" or "mpi".
        what: the collective ("allreduce(sum)", "broadcast", ...).
        seconds: how long it has been in flight.
        timeout: the limit it passed.

    Example:
        >>> "MLDIST_COMMUNICATION=ring" in stall_message(0, "nccl", "allreduce(sum)", 601, 600)
        True
    """
    hint = HINTS.get(engine, "check the other ranks' output")
    return (
        f"rank {rank} waited {seconds:.0f} s in {what} (engine {engine}) for the other workers, more than "
        f"MLDIST_COLLECTIVE_TIMEOUT={timeout:g}; {hint}; raise MLDIST_COLLECTIVE_TIMEOUT if one step "
        "really takes this long (0 turns the watch off)"
    )


#: Counters read from the graph: (collectives started, finished, index of the last started in its names).
Probe = Callable[[], tuple[int, int, int]]


class Watch:
    """Collectives in flight on this rank and the thread that ends the process when one stalls.

    Marks come from Python (:meth:`begin`/:meth:`end`, the MPI engine's callbacks) or from
    graph counters that ``probe`` reads (TensorFlow's engines): started != finished means one
    is in flight, since the counters last changed.

    Args:
        rank, engine: named in the message.
        timeout: seconds (> 0).
        probe: reads the graph counters, or None.
        names: what each index the probe returns stands for (appended to while tracing).
        clock: the time source (tests pass a fake one).
    """

    def __init__(
        self,
        rank: int,
        engine: str,
        timeout: float,
        probe: Probe | None = None,
        names: Sequence[str] = (),
        clock: Any = time.monotonic,
    ) -> None:
        self.rank, self.engine, self.timeout, self._clock = rank, engine, timeout, clock
        self.probe, self.names = probe, names
        self._flight: dict[int, tuple[str, float]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] = (0, 0, 0)
        self._since = 0.0

    def begin(self, what: str) -> int:
        """Mark a collective as started; the token to pass to :meth:`end`."""
        token = next(self._ids)
        with self._lock:
            self._flight[token] = (what, self._clock())
        return token

    def end(self, token: int) -> None:
        """Mark the collective of ``token`` as finished."""
        with self._lock:
            self._flight.pop(token, None)

    def _probed(self, now: float) -> tuple[str, float] | None:
        """The graph's collective in flight and since when, from the counters."""
        if self.probe is None:
            return None
        counts = self.probe()
        if counts != self._seen:
            self._seen, self._since = counts, now
        started, finished, index = counts
        if started == finished:
            return None
        return (self.names[index] if 0 <= index < len(self.names) else "a collective", self._since)

    def overdue(self) -> str | None:
        """The message for the oldest collective in flight past the timeout, else None."""
        now = self._clock()
        with self._lock:
            marks = list(self._flight.values())
        probed = self._probed(now)
        oldest = min([*marks, *([probed] if probed else [])], key=lambda item: item[1], default=None)
        if oldest is None or now - oldest[1] <= self.timeout:
            return None
        return stall_message(self.rank, self.engine, oldest[0], now - oldest[1], self.timeout)

    def run(self) -> None:
        """The daemon thread's loop: check every second, end the process on a stall."""
        while True:
            time.sleep(min(_CHECK_SECONDS, self.timeout / 4))
            if message := self.overdue():
                end_process(message)


def end_process(message: str) -> None:
    """End this rank with ``message`` through the runtime's one exit path (MPI engine: abort the job)."""
    leave(message, STALL_EXIT_CODE)


_watch: Watch | None = None


def start(
    rank: int, engine: str, env: Mapping[str, str], probe: Probe | None = None, names: Sequence[str] = ()
) -> Watch | None:
    """Start the watch for this rank (``init`` does, with 2+ workers); None when turned off.

    Args:
        rank, engine: named in the message.
        env: for ``MLDIST_COLLECTIVE_TIMEOUT``.
        probe, names: the engine's graph counters and what their indices name (see :class:`Watch`).
    """
    global _watch
    timeout = collective_timeout(env)
    if _watch is None and timeout > 0:
        _watch = Watch(rank, engine, timeout, probe, names)
        threading.Thread(target=_watch.run, name="mldist-collective-watch", daemon=True).start()
    return _watch


def begin(what: str) -> int:
    """Mark a collective as started (0 when the watch is off); cheap: a lock and a dict entry."""
    return _watch.begin(what) if _watch is not None else 0


def end(token: int) -> None:
    """Mark the collective of ``token`` as finished."""
    if _watch is not None:
        _watch.end(token)


def active() -> bool:
    """Whether collectives are being watched (graph markers are only built then)."""
    return _watch is not None
