"""The slow rank, named while the job runs: who arrives last at the collectives, and what it costs the others.

Every rank's collective watch (:mod:`mldist.runtime.watch.stall`) keeps, for its last :data:`KEPT`
collectives, an :data:`Entry`: the collective's number, how long the rank waited in it, and how
long since its previous collective ended; its progress record carries them
(:mod:`mldist.base.progress`). The rank that arrives last at a collective waits least in it: the
others waited for it, and what each waited beyond its wait is what it cost them. Only durations
are compared, each on its own rank's clock: hosts' clocks need not agree.

Rank 0's watch thread (:class:`mldist.runtime.watch.straggler_watch.Tracker`) reads every record about
once a second and pairs each collective's waits across ranks (a :class:`Sample`). When one rank,
or one node, costs the others at least ``MLDIST_STRAGGLER_PERCENT`` of their time (default 10) in each third of the last
``MLDIST_STRAGGLER_SECONDS`` (default 30), arriving last at most of its collectives (:data:`LAST_SHARE`), or
does so for four windows running at half that cost (:func:`find_lasting`: a rank 10 % slower costs the others
about 9 %), rank 0 prints one line, once (:func:`message`), and writes it to ``straggler.json`` in the run
directory, which ``mldist status`` shows; at the line and at exit it draws ``straggler.png``, each rank's wait
per step. A one-off delay (start-up, a checkpoint) fills one third at most: no line. Ranks whose records rank 0
cannot see (other nodes without a shared progress folder, ``MLDIST_RUN_DIR``) leave every collective unpaired:
no line.

Example:
    >>> s = sample(7, {0: (0.20, 0.25), 1: (0.01, 0.25)}, {0: "n1", 1: "n2"})
    >>> s.last, round(s.cost, 2), s.span
    (1, 0.19, 0.25)
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...base import progress

#: One collective on one rank: (its number, seconds this rank waited in it, seconds since its previous one ended).
Entry = tuple[int, float, float]
#: How many of its last collectives a rank publishes (a few seconds of a fast job's collectives).
KEPT = 512


def entry(number: int, began: float, ended_before: float | None, now: float) -> Entry:
    """The :data:`Entry` of collective ``number`` that began at ``began`` and ends ``now`` (one clock).

    Example:
        >>> entry(3, 10.0, 9.5, 10.25)
        (3, 0.25, 0.75)
    """
    return (number, now - began, now - (began if ended_before is None else ended_before))


@dataclass(frozen=True)
class Sample:
    """One collective that every rank reported.

    Args:
        number: the collective's number.
        waits: each rank's wait in it (seconds), by rank.
        last: the rank that waited least: it arrived last.
        cost: what it cost the others: their mean wait beyond its own (seconds).
        span: the time it closes: the mean of the ranks' seconds since their previous collective ended.
        node: the host of ``last``; node_cost: the other hosts' ranks' mean wait beyond its ranks' least
            (0 when every rank runs on one host).
    """

    number: int
    waits: tuple[float, ...]
    last: int
    cost: float
    span: float
    node: str
    node_cost: float


def sample(number: int, found: Mapping[int, tuple[float, float]], hosts: Mapping[int, str]) -> Sample:
    """The :class:`Sample` of collective ``number`` from every rank's (wait, gap).

    Example:
        >>> s = sample(1, {0: (0.3, 1.0), 1: (0.3, 1.0), 2: (0.0, 1.0), 3: (0.0, 1.0)},
        ...            {0: "a", 1: "a", 2: "b", 3: "b"})
        >>> s.last, s.node, round(s.cost, 2), round(s.node_cost, 2)
        (2, 'b', 0.2, 0.3)
    """
    ranks = sorted(found)
    waits = tuple(found[r][0] for r in ranks)
    last = min(ranks, key=lambda r: found[r][0])
    others = [found[r][0] - found[last][0] for r in ranks if r != last]
    node = hosts.get(last, "?")
    away = [found[r][0] for r in ranks if hosts.get(r, "?") != node]
    least = min(found[r][0] for r in ranks if hosts.get(r, "?") == node)
    return Sample(
        number,
        waits,
        last,
        sum(others) / max(1, len(others)),
        sum(found[r][1] for r in ranks) / len(ranks),
        node,
        sum(away) / len(away) - least if away else 0.0,
    )


def samples_of(
    numbers: np.ndarray[Any, Any],
    waits: np.ndarray[Any, Any],
    gaps: np.ndarray[Any, Any],
    node: np.ndarray[Any, Any],
    names: Sequence[str],
) -> list[Sample]:
    """The :class:`Sample` of each collective, as :func:`sample` makes it, from arrays (collectives x ranks).

    Their ``waits`` are left empty: at thousands of ranks rank 0 keeps each rank's wait only summed.

    Args:
        numbers: the collectives' numbers; waits, gaps: each rank's wait and gap in each.
        node: each rank's host, as an index into ``names``.

    Example:
        >>> w = np.array([[0.3, 0.3, 0.0, 0.0]])
        >>> s, = samples_of(np.array([1]), w, np.ones((1, 4)), np.array([0, 0, 1, 1]), ["a", "b"])
        >>> s.last, s.node, round(s.cost, 2), round(s.node_cost, 2)
        (2, 'b', 0.2, 0.3)
    """
    k, size = waits.shape
    if not k:
        return []
    last = waits.argmin(axis=1)
    least = waits[np.arange(k), last]
    cost = (waits.sum(axis=1) - size * least) / max(1, size - 1)
    home = node[last]
    away = node[None, :] != home[:, None]
    count = away.sum(axis=1)
    node_cost = np.where(count > 0, (waits * away).sum(axis=1) / np.maximum(count, 1) - least, 0.0)
    span = gaps.mean(axis=1)
    return [
        Sample(int(numbers[i]), (), int(last[i]), float(cost[i]), float(span[i]), names[home[i]], float(node_cost[i]))
        for i in range(k)
    ]


@dataclass(frozen=True)
class Finding:
    """A rank (or a node) that keeps the others waiting.

    Args:
        rank: the slow rank (for a node: its rank that arrived last most often).
        host: its host.
        ranks: the ranks named: the one, or every rank of the node.
        node: whether the whole node is named.
        last_share: the share of collectives it arrived last at (0 to 1).
        cost: seconds it cost the others per step (per second when ``per`` is "second").
        share: the share of the others' time it cost (0 to 1).
        per: "step" or "second" (no step count: a custom loop without Keras's ``fit``).
        where: its most frequent line of code outside collectives ("" when unknown).
    """

    rank: int
    host: str
    ranks: tuple[int, ...]
    node: bool
    last_share: float
    cost: float
    share: float
    per: str
    where: str


def message(f: Finding) -> str:
    """The one line rank 0 prints.

    Example:
        >>> line = message(Finding(3, "node7", (3,), False, 0.96, 0.18, 0.31, "step", "data.py:42 next_batch"))
        >>> line[:72]
        'rank 3 (node7) arrives last at 96 % of collectives, costing the others 1'
        >>> line[72:]
        '80 ms a step (31 %); it spends its time in data.py:42 next_batch'
    """
    who = f"node {f.host} (ranks {', '.join(map(str, f.ranks))})" if f.node else f"rank {f.rank} ({f.host})"
    line = (
        f"{who} arrives last at {100 * f.last_share:.0f} % of collectives, "
        f"costing the others {1000 * f.cost:.0f} ms a {f.per} ({100 * f.share:.0f} %)"
    )
    if f.where:
        line += f"; {'its rank ' + str(f.rank) if f.node else 'it'} spends its time in {f.where}"
    return line


def _shares(samples: Sequence[Sample], node: bool) -> dict[Any, float]:
    """What each rank (or node) cost the others over ``samples``, as a share of their time."""
    span = sum(s.span for s in samples)
    out: dict[Any, float] = collections.defaultdict(float)
    for s in samples:
        if node:
            out[s.node] += s.node_cost
        else:
            out[s.last] += s.cost
    return {k: v / span for k, v in out.items()} if span > 0 else {}


def _thirds(stamped: Sequence[tuple[float, Sample]], start: float, seconds: float) -> list[list[Sample]]:
    """The samples of each third of the ``seconds`` from ``start``."""
    thirds: list[list[Sample]] = [[], [], []]
    for t, s in stamped:
        if start <= t <= start + seconds:
            thirds[min(2, int(3 * (t - start) / seconds))].append(s)
    return thirds


def find(
    stamped: Sequence[tuple[float, Sample]],
    hosts: Mapping[int, str],
    percent: float,
    seconds: float,
    now: float,
    steps: float | None = None,
    where: Mapping[int, str] | None = None,
) -> Finding | None:
    """The rank (else the node) that cost the others ``percent`` % of their time or more in each third of
    the last ``seconds``, or None.

    Args:
        stamped: (when it was seen, sample), oldest first; those before the window are left out.
        hosts: each rank's host.
        percent, seconds: the thresholds (``MLDIST_STRAGGLER_PERCENT``, ``MLDIST_STRAGGLER_SECONDS``).
        now: the time, on the clock of the stamps.
        steps: the steps made over the window (None or 0: unknown; the cost is then per second).
            The share said is the middle third's, and the cost a step that share of a step's time.
        where: each rank's most frequent line outside collectives.

    Example:
        >>> slow = [(t / 4, sample(t, {0: (0.2, 0.25), 1: (0.0, 0.25)}, {0: "a", 1: "b"})) for t in range(40)]
        >>> f = find(slow, {0: "a", 1: "b"}, 10, 9, now=10.0, steps=36)
        >>> f.rank, f.last_share, round(f.share, 2), round(f.cost, 2)
        (1, 1.0, 0.8, 0.2)
        >>> find(slow, {0: "a", 1: "b"}, 10, 30, now=10.0) is None   # not watched that long yet
        True
    """
    window, thirds = [s for t, s in stamped if t >= now - seconds], _thirds(stamped, now - seconds, seconds)
    if not stamped or stamped[0][0] > now - seconds or not window or not all(thirds):
        return None
    return _named(thirds, window, hosts, percent, seconds, steps, where, least_last=LAST_SHARE)


#: The share of the collectives of each part of a window that the rank named arrived last at, at least: a clear
#: majority, not what load on a balanced run's ranks gives one of them for a while; or, among many ranks (or
#: nodes), :data:`FAIR_TIMES` times its fair share, whichever is less: two slow ranks of thousands share the
#: last arrivals, and are named.
LAST_SHARE, FAIR_TIMES = 2 / 3, 2.0
#: The lasting rule (:func:`find_lasting`): over this many windows, split in thirds of a window, a rank (or node)
#: that arrives last at a clear majority of collectives (:data:`RUN_LAST_SHARE`) and costs the others at least
#: this fraction of ``MLDIST_STRAGGLER_PERCENT`` in every part is named. A rank 10 % slower than the others
#: costs them about 9 % of their time: one window's 10 % misses it, four windows of a steady lead do not; a
#: balanced run's last rank changes from collective to collective, and a burst of load fills a part or two.
LASTING_WINDOWS, LASTING_FRACTION = 4, 0.5
#: The parts of the lasting rule's windows that may fall short (a burst of load on another rank for a few seconds).
LASTING_SPARE = 2


def find_lasting(
    stamped: Sequence[tuple[float, Sample]],
    hosts: Mapping[int, str],
    percent: float,
    seconds: float,
    now: float,
    steps: float | None = None,
    where: Mapping[int, str] | None = None,
) -> Finding | None:
    """The rank (else the node) that arrived last at most collectives (:data:`RUN_LAST_SHARE`) of the last
    :data:`LASTING_WINDOWS` windows and cost the others :data:`LASTING_FRACTION` of ``percent`` % or more in each
    third of a window of them (all but :data:`LASTING_SPARE`), or None.

    Args:
        stamped, hosts, where: as for :func:`find`.
        percent, seconds: the thresholds; the long window is ``LASTING_WINDOWS * seconds``.
        now: the time, on the clock of the stamps; steps: the steps made over the long window (None: unknown).

    Example:
        >>> hosts = {0: "a", 1: "b"}
        >>> slow = [(t / 4, sample(t, {0: (0.027, 0.3), 1: (0.0, 0.3)}, hosts)) for t in range(4 * 125)]
        >>> find(slow, hosts, 10, 30, now=124.0) is None   # 9 % of the others' time: one window misses it
        True
        >>> f = find_lasting(slow, hosts, 10, 30, now=124.0, steps=480)
        >>> f.rank, f.last_share, round(f.share, 2)
        (1, 1.0, 0.09)
        >>> find_lasting(slow, hosts, 10, 30, now=100.0) is None   # not watched that long yet
        True
    """
    long = LASTING_WINDOWS * seconds
    parts: list[list[Sample]] = [[] for _ in range(3 * LASTING_WINDOWS)]
    start = now - long
    for t, s in stamped:
        if start <= t <= now:
            parts[min(len(parts) - 1, int(len(parts) * (t - start) / long))].append(s)
    if not stamped or stamped[0][0] > start or not all(parts):
        return None
    window = [s for part in parts for s in part]
    return _named(parts, window, hosts, LASTING_FRACTION * percent, long, steps, where, LASTING_SPARE, LAST_SHARE)


#: The fewest collectives a whole run must pair for :func:`find_in_run` to name a rank (a few per third).
RUN_SAMPLES = 12
#: The share of a run's collectives its slow rank must arrive last at: a clear majority, not the half that
#: chance gives one of two ranks (rank 0, which runs the callbacks, came last at 55 % of the digits run's).
RUN_LAST_SHARE = 2 / 3


def find_in_run(
    samples: Sequence[Sample],
    hosts: Mapping[int, str],
    percent: float,
    steps: float | None = None,
    where: Mapping[int, str] | None = None,
) -> Finding | None:
    """At the end of a run shorter than the window: the rank (else the node) that arrived last at most of its
    collectives (:data:`RUN_LAST_SHARE`) and cost the others ``percent`` % of their time or more in each third
    of them, or None.

    The thirds are the run's collectives in order, not seconds: a one-off delay fills one at most, as in
    :func:`find`, however long the run stayed after its last collective.

    Args:
        samples: every collective the run paired, oldest first.
        hosts: each rank's host.
        percent: the threshold (``MLDIST_STRAGGLER_PERCENT``).
        steps: the steps the run made (None or 0: unknown; the cost is then per second).
        where: each rank's most frequent line outside collectives.

    Example:
        >>> slow = [sample(t, {0: (0.2, 0.25), 1: (0.0, 0.25)}, {0: "a", 1: "b"}) for t in range(24)]
        >>> f = find_in_run(slow, {0: "a", 1: "b"}, 10, steps=24)
        >>> f.rank, f.last_share, round(f.share, 2), round(f.cost, 2)
        (1, 1.0, 0.8, 0.2)
        >>> find_in_run(slow[:6], {0: "a", 1: "b"}, 10) is None   # too few collectives to tell
        True
    """
    if len(samples) < RUN_SAMPLES:
        return None
    n = len(samples)
    thirds = [list(samples[i * n // 3 : (i + 1) * n // 3]) for i in range(3)]
    found = _named(thirds, samples, hosts, percent, sum(s.span for s in samples), steps, where)
    return found if found is not None and found.last_share >= RUN_LAST_SHARE else None


def _several(hosts: Mapping[int, str]) -> bool:
    """Whether the ranks run on two hosts or more (stops at the second: thousands of ranks, every turn)."""
    values = iter(hosts.values())
    first = next(values, None)
    return any(h != first for h in values)


def _named(
    thirds: Sequence[Sequence[Sample]],
    window: Sequence[Sample],
    hosts: Mapping[int, str],
    percent: float,
    seconds: float,
    steps: float | None,
    where: Mapping[int, str] | None,
    spare: int = 0,
    least_last: float = 0.0,
) -> Finding | None:
    """The rank (else the node) that cost the others ``percent`` % or more, and arrived last at ``least_last`` of
    the collectives or more, in each of ``thirds`` of ``window`` (``seconds`` long, ``steps`` made in it) but
    ``spare`` of them, or None."""
    bar = percent / 100
    for node in (False, True):
        if node and not _several(hosts):
            break
        each = [_shares(third, node) for third in thirds]
        lasts = [collections.Counter(s.node if node else s.last for s in third) for third in thirds]
        least = min(least_last, FAIR_TIMES / max(1, len(set(hosts.values()) if node else hosts)))
        bars = [(part, last, least * len(third)) for part, last, third in zip(each, lasts, thirds, strict=True)]
        found = [k for k in set().union(*each) if sum(p.get(k, 0.0) < bar or n[k] < m for p, n, m in bars) <= spare]
        if not found:
            continue
        # The middle part's share: a one-off delay (start-up, the first step's tracing) fills one third at most.
        middle = len(each) // 2
        key = max(found, key=lambda k: (sorted(part.get(k, 0.0) for part in each)[middle], str(k)))
        share = sorted(part.get(key, 0.0) for part in each)[middle]
        mine = [s for s in window if (s.node if node else s.last) == key]
        rank = collections.Counter(s.last for s in mine).most_common(1)[0][0]
        per, cost = ("step", share * seconds / steps) if steps else ("second", share)
        ranks = tuple(sorted(r for r, h in hosts.items() if h == key)) if node else (rank,)
        last_share, said = len(mine) / len(window), (where or {}).get(rank, "")
        return Finding(rank, hosts.get(rank, "?"), ranks, node, last_share, cost, share, per, said)
    return None


def frame_of(record: progress.Record) -> str:
    """Where a rank's main thread is, as ``file:line function``, when it is outside collectives ("" else).

    Example:
        >>> r = progress.Record(1, "n", 9, 4, 4, None, None, ("data.py:42 next_batch: time.sleep(1)",), 1.0)
        >>> frame_of(r)
        'data.py:42 next_batch'
    """
    if record.current is not None or not record.stack:
        return ""
    return record.stack[0].split(": ", 1)[0]
