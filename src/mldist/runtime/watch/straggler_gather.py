"""The slow-rank account's rounds: each rank's newest collective waits, gathered at rank 0 by the engine.

Every rank's watch thread posts, about once a second (:data:`ROUND_SECONDS`), one fixed-size row
(:func:`row`): its host's name and the (number, wait, gap) of the collectives it picked since its
last round (:class:`Picker`). The engine carries the rows to rank 0 (an :class:`Aside` it hands out:
:class:`MpiAside`, a non-blocking ``MPI_Igather`` on a communicator of its own; :class:`KvAside`,
JAX's coordination service), so no rank reads a file and each rank sends one small row a second,
whatever the number of ranks. Rank 0 pairs the rows by collective number (:class:`Pool`).

A fast job's collectives are sampled: a rank picks the collectives whose number is a multiple of a
power of two (its stride), the smallest that keeps a round within :func:`slots`. Powers of two nest,
so the numbers every rank picked are those of the largest stride: they pair even where two ranks
chose different strides.

Example:
    >>> p = Picker(4)
    >>> for n in range(1, 11):
    ...     p.ended((n, 0.1, 0.2))
    >>> [e[0] for e in p.take()]   # ten in a round of four: the multiples of 4
    [4, 8]
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

#: How often every rank posts its round (seconds): the watch thread's turn.
ROUND_SECONDS = 1.0
#: A row's first values: the host's name and the rank's most frequent line outside collectives (bytes,
#: NUL-padded, as float64 bits), the count of entries, and 1 in the rank's last round (at its exit).
HOST_VALUES, FRAME_VALUES = 8, 16
COUNT, LAST = HOST_VALUES + FRAME_VALUES, HOST_VALUES + FRAME_VALUES + 1
HEAD = LAST + 1
#: Rank 0 keeps the numbers of at most this many rounds of entries waiting for every rank's.
POOL_ROUNDS = 8
#: The most entries a round brings rank 0 (all ranks together): its cost a second stays bounded.
ROUND_VALUES = 2**17


def slots(size: int) -> int:
    """How many collectives a rank sends a round: every one at small scale, fewer as ranks grow.

    Example:
        >>> slots(2), slots(1024), slots(16384)
        (256, 128, 8)
    """
    return max(8, min(256, ROUND_VALUES // max(1, size)))


def width(size: int) -> int:
    """The values in one row (:func:`row`) for ``size`` ranks.

    Example:
        >>> width(2)
        794
    """
    return HEAD + 3 * slots(size)


def text_values(text: str, count: int) -> np.ndarray[Any, Any]:
    """``text`` as ``count`` float64s (its UTF-8 bytes, the first ``8 * count``, NUL-padded).

    Example:
        >>> text_of(text_values("node7", HOST_VALUES))
        'node7'
    """
    raw = text.encode()[: 8 * count].ljust(8 * count, b"\0")
    out: np.ndarray[Any, Any] = np.frombuffer(raw, np.float64).copy()
    return out


def text_of(values: np.ndarray[Any, Any]) -> str:
    """The text that :func:`text_values` wrote."""
    return np.ascontiguousarray(values, np.float64).tobytes().rstrip(b"\0").decode(errors="replace")


def row(
    host: str, frame: str, entries: Sequence[tuple[int, float, float]], size: int, last: bool = False
) -> np.ndarray[Any, Any]:
    """One rank's round: host, frame, count, last, then the numbers, waits and gaps of ``entries`` (the newest
    that fit).

    Example:
        >>> r = row("a", "x.py:1 f", [(5, 0.25, 0.5)], 2)
        >>> text_of(r[:HOST_VALUES]), r[[COUNT, HEAD, HEAD + 256, HEAD + 512]].tolist()
        ('a', [1.0, 5.0, 0.25, 0.5])
    """
    n = slots(size)
    out = np.zeros(HEAD + 3 * n, np.float64)
    out[:HOST_VALUES] = text_values(host, HOST_VALUES)
    out[HOST_VALUES:COUNT] = text_values(frame, FRAME_VALUES)
    kept = list(entries)[-n:]
    out[COUNT], out[LAST] = len(kept), float(last)
    if kept:
        values = np.asarray(kept, np.float64)
        for i in range(3):
            out[HEAD + i * n : HEAD + i * n + len(kept)] = values[:, i]
    return out


def distinct(values: Any) -> Any:
    """``values``' distinct elements, sorted: ``np.unique`` without its first call's import of ``numpy.ma``
    (9 ms on rank 0 at every start).

    Example:
        >>> distinct(np.array([3, 1, 3, 2])).tolist(), distinct(np.zeros(0, np.int64)).tolist()
        ([1, 2, 3], [])
    """
    ordered = np.sort(values, axis=None)
    if ordered.size == 0:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


class Picker:
    """What one rank sends: the collectives it picked since its last round (the collective's thread calls
    :meth:`ended`, the watch thread :meth:`take`).

    Args:
        most: the most entries a round sends (:func:`slots`).

    Attributes:
        count: the collectives ended since the last round.
    """

    def __init__(self, most: int) -> None:
        self.most, self.mask, self.count = most, 0, 0
        self._picked: list[tuple[int, float, float]] = []

    def ended(self, entry: tuple[int, float, float]) -> None:
        """One collective ended (its :data:`mldist.runtime.watch.straggler.Entry`): kept when its number is picked."""
        self.count += 1
        if entry[0] & self.mask == 0:
            self._picked.append(entry)

    def take(self) -> list[tuple[int, float, float]]:
        """The round's entries (at most :attr:`most`); the stride follows the rate of the round."""
        picked, self._picked = self._picked, []
        count, self.count = self.count, 0
        mask = self.mask
        while len(picked) > self.most:  # more than a round holds: the multiples of a larger power of two
            mask = 2 * mask + 1
            picked = [e for e in picked if e[0] & mask == 0]
        while count > self.most * (mask + 1):
            mask = 2 * mask + 1
        while mask and count * 2 <= self.most * (mask + 1) // 2:
            mask //= 2  # slower now: pick more
        self.mask = mask
        return picked


Paired = tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]


class Pool:
    """Rank 0's collectives waiting for every rank's entry, by number; those every rank sent come out paired.

    Args:
        size: the number of ranks.
        most: the most entries a row holds (:func:`slots`).

    Example:
        >>> pool = Pool(2, 4)
        >>> numbers, waits, gaps = pool.add(np.stack([row("a", "", [(3, 0.2, 0.3)], 2), row("b", "", [], 2)]))
        >>> len(numbers)
        0
        >>> numbers, waits, gaps = pool.add(np.stack([row("a", "", [], 2), row("b", "", [(3, 0.0, 0.3)], 2)]))
        >>> numbers.tolist(), waits.tolist()
        ([3], [[0.2, 0.0]])
    """

    def __init__(self, size: int, most: int) -> None:
        self.size, self.upto = size, 0
        rows = POOL_ROUNDS * most
        # One row more: what is not kept lands there, so a round's grid of entries is written in one go. Rank
        # by rank (ranks x rows): a rank's entries of a round land side by side in memory.
        self.trash = rows
        self.waits, self.gaps = np.zeros((size, rows + 1)), np.zeros((size, rows + 1))
        self.have = np.zeros((size, rows + 1), bool)
        self._slot: dict[int, int] = {}  # number -> its row
        self._free = list(range(rows))

    def _place(self, number: int) -> int:
        """The row of collective ``number`` (a free one, or the oldest's when none is); the trash when too old."""
        if (slot := self._slot.get(number)) is not None:
            return slot
        if not self._free:
            oldest = min(self._slot)
            if number < oldest:
                return self.trash
            self._free.append(self._slot.pop(oldest))
        slot = self._free.pop()
        self.have[:, slot] = False
        self._slot[number] = slot
        return slot

    def add(self, rows: np.ndarray[Any, Any], mine: int | None = None) -> Paired:
        """Take one round's rows (ranks x values); the numbers, waits and gaps (collectives x ranks) now complete.

        ``mine``: a rank whose row is taken elsewhere (rank 0 adds its own entries as it picks them).
        """
        n = (rows.shape[1] - HEAD) // 3
        count = np.clip(rows[:, COUNT], 0, n).astype(np.int64)
        if mine is not None:
            count[mine] = 0
        nums = rows[:, HEAD : HEAD + n].astype(np.int64)
        keep = (np.arange(n)[None, :] < count[:, None]) & (nums > self.upto)
        ranks = np.arange(len(rows))[:, None]
        return self._fill(nums, keep, ranks, rows[:, HEAD + n : HEAD + 2 * n], rows[:, HEAD + 2 * n :])

    def _fill(self, nums: Any, keep: Any, ranks: Any, waits: Any, gaps: Any) -> Paired:
        """Write the kept entries (same-shaped grids; ``ranks`` broadcasts) into their collectives' rows."""
        none = np.zeros(0, np.int64), np.zeros((0, self.size)), np.zeros((0, self.size))
        if not keep.any():
            return none
        lo, hi = int(np.where(keep, nums, nums.max()).min()), int(np.where(keep, nums, nums.min()).max())
        if hi - lo > 2**22:  # numbers far apart (a damaged row): the slow way
            uniq = distinct(nums[keep])
            lut_of = {int(u): self._place(int(u)) for u in uniq}
            at = np.where(keep, np.vectorize(lambda k: lut_of.get(int(k), self.trash))(nums), self.trash)
            slots = np.array(sorted(set(lut_of.values()) - {self.trash}), np.int64)
        else:
            index = np.where(keep, nums - lo, hi - lo + 1)
            present = np.zeros(hi - lo + 2, bool)
            present[index] = True
            uniq = np.flatnonzero(present[:-1]) + lo
            lut = np.full(hi - lo + 2, self.trash, np.int64)
            lut[uniq - lo] = [self._place(int(u)) for u in uniq]
            at = lut[index]
            slots = distinct(lut[uniq - lo])
            slots = slots[slots != self.trash]
        self.waits[ranks, at], self.gaps[ranks, at], self.have[ranks, at] = waits, gaps, True
        return self._complete(slots) if len(slots) else none

    def _complete(self, slots: Any) -> Paired:
        """The collectives of ``slots`` that every rank sent, oldest first; their rows freed."""
        full = slots[self.have[:, slots].all(axis=0)]
        by_slot = {slot: number for number, slot in self._slot.items()}
        order = sorted(full.tolist(), key=lambda slot: by_slot[slot])
        numbers = np.array([by_slot[slot] for slot in order], np.int64)
        out = (numbers, self.waits[:, order].T.copy(), self.gaps[:, order].T.copy())
        if len(numbers):
            self.upto = max(self.upto, int(numbers[-1]))
            for number in [k for k in self._slot if k <= self.upto]:  # paired, or skipped by a rank: never will
                self._free.append(self._slot.pop(number))
        return out

    def own(self, rank: int, entries: Sequence[tuple[int, float, float]]) -> Paired:
        """Take rank ``rank``'s own entries (rank 0's, as it picks them); what is now complete."""
        values = np.asarray(entries, np.float64).reshape(-1, 3)
        nums = values[:, 0].astype(np.int64)
        return self._fill(nums, nums > self.upto, np.full(len(nums), rank), values[:, 1], values[:, 2])


def scaled(numbers: np.ndarray[Any, Any], waits: np.ndarray[Any, Any]) -> Any:
    """Each rank's wait in the collectives paired in one round, scaled to all it made (a fast job's are sampled).

    Example:
        >>> scaled(np.array([4, 8]), np.array([[0.1, 0.0], [0.1, 0.0]])).tolist()
        [0.8, 0.0]
    """
    if not len(numbers):
        return 0.0
    step = max(1.0, float(np.median(np.diff(numbers)))) if len(numbers) > 1 else 1.0
    return waits.sum(axis=0) * step


class Aside(Protocol):
    """An engine's channel for the rounds: every rank posts, rank 0 collects."""

    def post(self, values: np.ndarray[Any, Any]) -> None:
        """Send this rank's row; never waits for the other ranks."""
        ...

    def collect(self, wait: float = 0.0) -> list[np.ndarray[Any, Any]]:
        """At rank 0: the rounds every rank's row reached, oldest first, each (ranks, width); waits up to ``wait`` s."""
        ...

    def waiting(self) -> bool:
        """At rank 0: whether a round may still come in (false: none will until this rank posts again)."""
        ...


class MpiAside:
    """Rounds as ``MPI_Igather`` to rank 0 on a communicator of their own (the watch threads' only MPI calls).

    Posts are matched in order on every rank, and each row says which collectives it holds, so a rank that
    posts late only delays a round. A round still open when the job ends is left to MPI_Finalize.

    Args:
        comm: the communicator (a duplicate of the engine's world, made by every rank at start).
        size: the number of ranks.
    """

    #: Rounds a rank lets wait before it stops posting, and the most memory rank 0's open rounds may hold.
    OPEN, OPEN_BYTES = 64, 2**26

    def __init__(self, comm: Any, size: int) -> None:
        self.comm, self.size, self.root = comm, size, comm.Get_rank() == 0
        self._open: list[tuple[Any, np.ndarray[Any, Any] | None, np.ndarray[Any, Any]]] = []
        self.most = max(4, min(self.OPEN, self.OPEN_BYTES // (8 * size * width(size))))

    def post(self, values: np.ndarray[Any, Any]) -> None:
        """``MPI_Igather`` this row to rank 0 (rank 0 keeps a buffer for every rank's)."""
        self._open = [o for o in self._open if not (not self.root and o[0].Test())]
        if len(self._open) >= self.most:
            return
        got = np.empty((self.size, values.size), np.float64) if self.root else None
        self._open.append((self.comm.Igather(values, got, root=0), got, values))

    def collect(self, wait: float = 0.0) -> list[np.ndarray[Any, Any]]:
        """The rounds that completed, in the order they were posted."""
        until, done = time.monotonic() + wait, []
        while self._open and self.root:
            request, got, _ = self._open[0]
            if not request.Test():
                if time.monotonic() >= until:
                    break
                time.sleep(0.01)
                continue
            self._open.pop(0)
            if got is not None:
                done.append(got)
        return done

    def waiting(self) -> bool:
        """Whether a round this rank posted is still open (only those can complete)."""
        return bool(self._open)


class KvAside:
    """Rounds through JAX's coordination service: each rank overwrites its key, rank 0 reads the folder of keys.

    A rank posts its last two rounds' entries in one row (:attr:`repeats`): rank 0 reads once a second as the
    ranks write, so an entry overwritten before it was read is in the next row.

    Args:
        client: ``jax.distributed``'s client; rank, size: this rank and the number of ranks.
    """

    PREFIX = "mldist/slow-rank/"
    repeats = 2

    def __init__(self, client: Any, rank: int, size: int) -> None:
        self.client, self.rank, self.size = client, rank, size
        self._last = b""

    def post(self, values: np.ndarray[Any, Any]) -> None:
        """Overwrite this rank's key with its row."""
        self.client.key_value_set_bytes(f"{self.PREFIX}{self.rank}", values.tobytes(), allow_overwrite=True)

    def collect(self, wait: float = 0.0) -> list[np.ndarray[Any, Any]]:
        """Every rank's latest row, once all have written one and something changed."""
        items = self.client.key_value_dir_get_bytes(self.PREFIX)
        if len(items) < self.size:
            time.sleep(wait)
            return []
        by_rank = sorted(items, key=lambda kv: int(kv[0].rsplit("/", 1)[-1]))
        blob = b"".join(bytes(v) for _, v in by_rank)
        if blob == self._last or len({len(v) for _, v in by_rank}) != 1:
            time.sleep(wait)
            return []
        self._last = blob
        return [np.frombuffer(blob, np.float64).reshape(self.size, -1)]

    def waiting(self) -> bool:
        """Always: any rank may overwrite its key with a newer row."""
        return True
