"""One round of ``mldist run``: a group of workers started and supervised to its end.

A round's inputs are one frozen :class:`Round` (its config, the workers' environment, how they start,
its number and the re-forming that led to it), worked out before it starts; :func:`play` starts its
group, waits for every worker, all or nothing, and gives an :class:`Ended`. What the whole run saw
(every round's group, the signals the launcher got) is its :class:`Tally`. The loops over rounds are in
:mod:`mldist.launch.local`: a plain loop for a fixed world (``--max-restarts``), the one elastic
supervisor (:mod:`mldist.launch.elastic`) for ``--min-np`` and ``--host-discovery-script``.

Example:
    >>> cfg = RunConfig(nprocs=2, command=("python", "train.py"))
    >>> Round(cfg, {}, Group).next().number
    1
    >>> failure_order([(0, 1), (1, -9)], {0: 0.0, 1: 0.0})
    [(1, -9), (0, 1)]
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass

from ..base import joined
from ..errors import REFORM_CODE, REQUEUE_CODE, LaunchError
from . import elastic
from .config import RunConfig
from .groups import Group
from .procs import STOPPING, describe, exit_code, say
from .remote import LOST_HOST_CODE, answering_hosts

__all__ = ["Ended", "Round", "Tally", "failure_order", "over_ssh", "play"]


@dataclass(frozen=True)
class Round:
    """What one round starts from, fixed before it starts.

    Args:
        cfg: the run's config for this round (an elastic world's hosts and worker count).
        env: the environment the workers inherit (:func:`mldist.launch.local.inherited`).
        kind: how the workers start (:class:`mldist.launch.groups.Group`'s kinds).
        number: how many rounds ran before (``MLDIST_RESTART``).
        reform: the re-forming of an elastic world that led to it (None: a first start, a fixed world's restart).
    """

    cfg: RunConfig
    env: Mapping[str, str]
    kind: type[Group]
    number: int = 0
    reform: elastic.Reform | None = None

    def next(self, cfg: RunConfig | None = None, reform: elastic.Reform | None = None) -> Round:
        """The round after this one: the same world again, or ``cfg``'s (re-formed by ``reform``)."""
        return dataclasses.replace(self, cfg=cfg or self.cfg, number=self.number + 1, reform=reform)


@dataclass(frozen=True)
class Ended:
    """How a round ended: its group, its exit code, its first failure (None: none) and, after a success,
    the line saying that its workers never formed a group ("" when they did; :mod:`mldist.base.joined`)."""

    group: Group
    code: int
    failure: str | None
    never: str


@dataclass
class Tally:
    """What the whole run saw, for its record and its signal handlers: every round's group, the signals
    the launcher got, and the last round's exit code (None: none ended) and never-formed line."""

    groups: list[Group] = dataclasses.field(default_factory=list)
    received: list[int] = dataclasses.field(default_factory=list)
    code: int | None = None
    never: str = ""

    def stopping(self) -> bool:
        """Whether the launcher was asked to stop (SIGTERM, SIGINT)."""
        return any(s in STOPPING for s in self.received)


def play(rnd: Round, tally: Tally) -> Ended:
    """Start the round's group and supervise it to its end (the group joins ``tally`` first, for the signals).

    A fixed world's restart over ssh asks its hosts first; an elastic run with a discovery script watches
    it meanwhile (:class:`mldist.launch.elastic.Watch`).
    """
    cfg = rnd.cfg
    group = rnd.kind(cfg, rnd.env, restart=rnd.number, reform=rnd.reform)
    tally.groups.append(group)
    watch = elastic.Watch(cfg, rnd.env, rnd.number) if cfg.elastic is not None and cfg.elastic.discovery else None
    try:
        if rnd.number and cfg.elastic is None and over_ssh(cfg):  # a restart: has a host gone meanwhile?
            try:
                answering_hosts(cfg, rnd.env)
            except LaunchError as exc:
                say(str(exc))
                return _tallied(tally, Ended(group, LOST_HOST_CODE, str(exc), ""))
        group.start()
        if watch is not None:
            watch.start()
        code, failure = _supervise(cfg, group, tally.received)
        # Asked only of a run that succeeded (a failed one said why already), before the notes directory goes.
        never = joined.line(joined.read(group.progress), cfg.nprocs) if code == 0 else ""
        return _tallied(tally, Ended(group, code, failure, never))
    finally:
        if watch is not None:
            watch.stop()
        group.finish()


def _tallied(tally: Tally, ended: Ended) -> Ended:
    tally.code, tally.never = ended.code, ended.never
    return ended


def over_ssh(cfg: RunConfig) -> bool:
    """Whether mpiexec reaches the hosts of ``cfg`` over ssh (``-H``, ``--hostfile``; not an allocation's)."""
    return bool(cfg.hosts) and cfg.allocation is None


def _finished(group: Group, pending: set[int]) -> list[tuple[int, int]]:
    """(rank, code) of the ranks that ended since the last look, in :func:`failure_order`."""
    done = [(rank, code) for rank in sorted(pending) if (code := group.procs[rank].poll()) is not None]
    return failure_order(done, {rank: getattr(group.procs[rank], "finished_at", 0.0) for rank, _ in done})


def failure_order(done: list[tuple[int, int]], finished_at: Mapping[int, float]) -> list[tuple[int, int]]:
    """Ranks that ended between two looks, the likely first failure first: by time where the group
    knows it (mpiexec's reports), then a rank killed by a signal before one that exited, then by rank.

    A killed rank cannot have died of its peers' failure, while an exit code can follow one (a
    collective aborted because a peer died): under load both can end between two looks.

    Example:
        >>> failure_order([(0, 1), (1, -9)], {0: 0.0, 1: 0.0})
        [(1, -9), (0, 1)]
    """
    return sorted(done, key=lambda rc: (finished_at.get(rc[0], 0.0), rc[1] >= 0, rc[0]))


def _supervise(cfg: RunConfig, group: Group, received: list[int]) -> tuple[int, str | None]:
    """Wait for every worker; the group's exit code and its first failure, if any."""
    first_failure: tuple[int, str] | None = None
    first_nonzero: int | None = None
    deadline: float | None = None
    pending = set(range(cfg.nprocs))
    early: list[int] = []  # ranks that ended with 0 while others still ran
    while pending:
        if deadline is None and any(s in STOPPING for s in received):
            sig = next(s for s in received if s in STOPPING)
            say(f"got {signal.Signals(sig).name}; workers have {cfg.grace:g} s to exit")
            deadline = time.monotonic() + cfg.grace
        group.deliver_pending()
        for rank, code in _finished(group, pending):
            pending.discard(rank)
            if code == 0:
                early.append(rank)
                continue
            if first_nonzero is None:
                first_nonzero = exit_code(code)
            if first_failure is None and deadline is None and code == REFORM_CODE and cfg.elastic is not None:
                # Every rank leaves at the same commit for the hosts that joined: no failure, no signal.
                group.failed_at = time.monotonic()
                first_failure = (REFORM_CODE, "the workers left at a commit for the hosts that joined")
                deadline = time.monotonic() + cfg.grace
            elif first_failure is None and deadline is None:
                group.failed_at = time.monotonic()
                first_failure = (exit_code(code), group.blame(rank, code, early))
                say(f"{first_failure[1]}; stopping the other workers")
                group.signal_all(signal.SIGTERM)
                # Exit 75: the others are saving a checkpoint too; give them the full grace.
                deadline = time.monotonic() + (cfg.grace if code == REQUEUE_CODE else cfg.failure_grace)
            elif first_failure is None:
                say(describe(rank, code))
        if deadline is not None and time.monotonic() > deadline and pending:
            say(f"killing ranks {sorted(pending)} after the grace period")
            group.signal_all(signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)
    if first_failure is not None:
        return first_failure[0], first_failure[1]
    return first_nonzero or 0, None
