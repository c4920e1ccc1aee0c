"""The one elastic supervisor: rounds of workers, started, monitored, stopped and re-formed through hooks.

Both elastic worlds run this loop: ``mldist run -H ... --min-np`` (:mod:`.onhosts`: mpiexec over ssh,
hosts probed with ssh ``true``) and an elastic Slurm job (:mod:`.slurm`: srun steps, nodes probed with a
one-task ``true`` step). As in torch elastic's agent, a side gives five hooks: ``start`` a round,
``monitor`` it to its end or to the first sign of trouble, ``probe`` its hosts after a failure (Slurm
through :func:`probe`; hosts through :mod:`mldist.launch.fanout`'s window: thousands at once), ``stop`` what is
left of it, and ``recover``: decide the next world (a :class:`Reform`) or the end. The loop moves a
:class:`WorkerState` along :data:`MOVES` and returns an all-or-nothing :class:`RunResult`: one code
for the whole world and every re-forming, recorded the same way on both sides
(``summary.json["elastic"]["reforms"]`` of both at the end; a Slurm job also keeps ``elastic.json`` up to
date while it runs).

A frozen host is declared lost within the bound that each side's probe gives (ssh's fixed
:data:`.onhosts.PROBE_TIMEOUT`, each host from its own start; Slurm's pace-based :func:`.slurm.probe_limit`
through :func:`probe`): the one place on each side to change how long a silent host is waited for.
The round it froze in ends first: on hosts by ssh's
keepalives or the stall watch, mpiexec killed if it still waits for the frozen daemon
(:mod:`mldist.launch.remote`); under Slurm by srun's report of the ranks the stall watch ended.

Example:
    >>> moved(WorkerState.INIT, WorkerState.HEALTHY)
    <WorkerState.HEALTHY: 'healthy'>
    >>> named(["srun: error: Node failure on node3", "epoch 2"], (re.compile(r"failure on (\\S+)"),))
    ['node3']
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from ...base.files import atomic_write


class WorkerState(enum.Enum):
    """Where the world is: torch elastic's states, cut to what the two sides tell apart."""

    INIT = "init"  # nothing started yet
    HEALTHY = "healthy"  # a round runs
    FAILED = "failed"  # a worker failed or a host was lost: re-form, or end with the round's code
    LEAVING = "leaving"  # the workers left at a commit for hosts that joined: grow
    SUCCEEDED = "succeeded"  # every worker ended with 0
    STOPPED = "stopped"  # asked to stop (a signal, a requeue): end with the round's code


#: The moves the loop makes; any other is a bug in a side's hooks.
MOVES: dict[WorkerState, frozenset[WorkerState]] = {
    WorkerState.INIT: frozenset({WorkerState.HEALTHY}),
    WorkerState.HEALTHY: frozenset(
        {WorkerState.FAILED, WorkerState.LEAVING, WorkerState.SUCCEEDED, WorkerState.STOPPED}
    ),
    WorkerState.FAILED: frozenset({WorkerState.HEALTHY, WorkerState.FAILED}),  # re-formed, or ended failed
    WorkerState.LEAVING: frozenset({WorkerState.HEALTHY, WorkerState.FAILED}),
    WorkerState.SUCCEEDED: frozenset(),
    WorkerState.STOPPED: frozenset(),
}


def moved(state: WorkerState, to: WorkerState) -> WorkerState:
    """``to``, once :data:`MOVES` allows it from ``state`` (else a RuntimeError: a hook broke the loop).

    Example:
        >>> moved(WorkerState.SUCCEEDED, WorkerState.HEALTHY)
        Traceback (most recent call last):
        ...
        RuntimeError: elastic supervisor: no move from succeeded to healthy
    """
    if to not in MOVES[state]:
        raise RuntimeError(f"elastic supervisor: no move from {state.value} to {to.value}")
    return to


@dataclass
class Reform:
    """One re-forming of the world, as both sides record it (``record()``).

    Times are seconds on the supervisor's clock from the moment it saw the failure (``seen_at``).

    Args:
        lost: hosts (nodes) left out.
        why: why they were, in words.
        before: workers of the round that ended.
        seen_at: ``time.monotonic()`` when the supervisor saw the failure.
        joined: hosts that joined.
        after: workers of the next round (0: the run ended).
        hosts_checked_s: from the failure to the decision (probing, waiting for hosts).
        restart_s: from the failure to the next round's start.
        resumed_s: from the failure to the workers' first line after resuming (``-H`` runs; None: unknown).
    """

    lost: list[str]
    why: str
    before: int
    seen_at: float
    joined: list[str] = dataclasses.field(default_factory=list)
    after: int = 0
    hosts_checked_s: float = 0.0
    restart_s: float | None = None
    resumed_s: float | None = None

    def record(self) -> dict[str, Any]:
        """The record for a file: every field but ``seen_at`` (a monotonic clock's reading).

        Example:
            >>> sorted(Reform(["n3"], "it does not answer", 3, 0.0, after=2).record())[:4]
            ['after', 'before', 'hosts_checked_s', 'joined']
        """
        out = dataclasses.asdict(self)
        out.pop("seen_at")
        out["loss_to_resume_s"] = out.pop("resumed_s")
        return out


def write_reforms(run_dir: str | None, reforms: Sequence[Reform]) -> None:
    """The re-formings so far in ``<run dir>/elastic.json`` (owner-only, written whole), when there is one."""
    if run_dir:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        text = json.dumps({"reforms": [r.record() for r in reforms]}, indent=1) + "\n"
        atomic_write(Path(run_dir) / "elastic.json", text, mode=0o600)


@dataclass(frozen=True)
class Recovery:
    """What a side decided after a failed round: the record (None: nothing re-formed), whether a next round
    starts, and the code the run ends with when none does."""

    reform: Reform | None
    again: bool
    code: int


@dataclass(frozen=True)
class RunResult:
    """How the whole run ended, all or nothing: its last state, its exit code and every re-forming."""

    state: WorkerState
    code: int
    reforms: tuple[Reform, ...]


R = TypeVar("R")


class Hooks(Protocol[R]):
    """What one side gives the loop; ``R`` is its handle on a round (a Group, an srun step)."""

    def start(self, number: int, reform: Reform | None) -> R:
        """Start round ``number`` (0 first); ``reform``: the re-forming that led to it."""

    def monitor(self, round_: R) -> tuple[WorkerState, int]:
        """Wait for the round's end or its first trouble: FAILED, LEAVING, SUCCEEDED or STOPPED, and a code."""

    def probe(self, round_: R) -> dict[str, bool]:
        """After FAILED: whether each host of the round answers ({}: the side does not ask)."""

    def stop(self, round_: R, answered: Mapping[str, bool], code: int) -> int:
        """End what is left of the round (at once when a host is silent); its exit code."""

    def recover(
        self, round_: R, state: WorkerState, code: int, answered: Mapping[str, bool], reformed: int
    ) -> Recovery:
        """After FAILED or LEAVING (``reformed``: re-formings so far): the next world, or the end."""


class Supervisor(Generic[R]):
    """The loop over rounds; ``state`` says where it is (:class:`WorkerState`), ``reforms`` what re-formed."""

    def __init__(self, hooks: Hooks[R], on_reform: Callable[[Sequence[Reform]], None] = lambda _: None) -> None:
        self.hooks, self.on_reform = hooks, on_reform
        self.state = WorkerState.INIT
        self.reforms: list[Reform] = []

    def run(self) -> RunResult:
        """Rounds until one ends without a re-forming; the run's result."""
        number, last = 0, None
        while True:
            if last is not None:  # the re-forming that led to this round: how long the world stood still
                last.restart_s = round(time.monotonic() - last.seen_at, 3)
                self.on_reform(self.reforms)
            round_ = self.hooks.start(number, last)
            self.state = moved(self.state, WorkerState.HEALTHY)
            ended, code = self.hooks.monitor(round_)
            self.state = moved(self.state, ended)
            if ended in (WorkerState.SUCCEEDED, WorkerState.STOPPED):
                return RunResult(ended, code, tuple(self.reforms))
            answered = self.hooks.probe(round_) if ended is WorkerState.FAILED else {}
            code = self.hooks.stop(round_, answered, code)
            got = self.hooks.recover(round_, ended, code, answered, len(self.reforms))
            if got.reform is not None:
                self.reforms.append(got.reform)
            if not got.again:
                self.state = moved(self.state, WorkerState.FAILED)
                return RunResult(self.state, got.code, tuple(self.reforms))
            number, last = number + 1, got.reform


def named(lines: Iterable[str], patterns: Sequence[re.Pattern[str]]) -> list[str]:
    """The hosts that a launcher's lines name, in order: each pattern's first group that matched.

    How both sides read their launcher's stderr (mpiexec's lost daemons and the shims' failed ranks;
    srun's failed tasks and nodes).
    """
    found: list[str] = []
    for line in lines:
        for pattern in patterns:
            match = pattern.search(line)
            host = next((g for g in match.groups() if g), "").rstrip(";,") if match else ""
            if host and host not in found:
                found.append(host)
    return found


def probe(
    hosts: Sequence[str],
    argv: Callable[[str], list[str]],
    env: Mapping[str, str],
    limit: Callable[[Sequence[float]], float],
) -> dict[str, bool]:
    """Whether each host runs a probe (``argv(host)``, asked in parallel) with exit code 0 in time.

    The one bound on how long a host may take to answer: ``limit`` gets the seconds the hosts that
    answered took so far and gives the seconds to wait in all (a fixed bound, or the controller's pace);
    a probe still running then is killed and its host counts as silent.

    Example::

        probe(["hx1", "hx2"], lambda h: ["ssh", h, "true"], env, lambda _: 10.0)   # {"hx1": True, "hx2": False}
    """
    t0 = time.monotonic()
    found: dict[str, tuple[bool, float]] = {}  # host: (answered, seconds it took)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for host in hosts:
        try:
            procs[host] = subprocess.Popen(
                argv(host),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=dict(env),
            )
        except OSError:
            found[host] = (False, 0.0)
    while len(found) < len(hosts):
        took = time.monotonic() - t0
        found |= {h: (p.returncode == 0, took) for h, p in procs.items() if h not in found and p.poll() is not None}
        if took > limit([t for ok, t in found.values() if ok]):
            break
        time.sleep(0.02)
    for host, p in procs.items():
        if host not in found:  # still connecting to a host that does not answer
            p.kill()
            p.wait()
    return {host: found.get(host, (False, 0.0))[0] for host in hosts}
