"""The local launcher behind ``mldist run``: N workers on this host, supervised.

All-or-nothing, like torchrun: if one worker fails, the others get SIGTERM
and, after a short grace, SIGKILL; the group's exit code is the first
failing worker's. Signals to the launcher are forwarded to every worker.
Each worker runs in its own session, so its whole process tree is
signalled and nothing is left behind.

The run configuration lives in :mod:`mldist.launch.config` and the process
utilities in :mod:`mldist.launch.procs`; their names are re-exported here, where
callers have always imported them from.

The launcher reads its own process environment once, in :func:`inherited`, and passes
that mapping down; ``RunConfig.env`` is what the workers get beyond it.

Example:
    >>> cfg = RunConfig(nprocs=2, command=("python", "train.py"), communication="ring")
    >>> decision, kind = launch_plan(cfg, {})
    >>> decision.name, kind.__name__
    ('ring', 'DirectGroup')
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import time
import uuid
from collections.abc import Mapping

from ..base import joined
from ..errors import REFORM_CODE, REQUEUE_CODE, ConfigError, LaunchError
from ..placement import common, engines
from ..placement.resources import thread_plan
from . import elastic
from .allocated import GROUPS, SRUN_STARTED, NodefileGroup
from .config import MAX_WORKERS, NETWORKS, RunConfig, command_problem, ensure_descriptors, prepare_log_dir
from .fanout import descriptor_plan
from .groups import DirectGroup, Group
from .mpiexec import MpiexecGroup, check_mpi_args, find_mpiexec
from .procs import FORWARDED, STOPPING, cpu_sets, describe, exit_code, say, worker_env
from .remote import LOST_HOST_CODE, RemoteGroup, answering_hosts
from .rundir import Record

#: The supervisor's names and, re-exported, those of config and procs that callers import from here.
__all__ = [
    "FORWARDED",
    "MAX_WORKERS",
    "NETWORKS",
    "RunConfig",
    "cpu_sets",
    "ensure_descriptors",
    "inherited",
    "launch_plan",
    "prepare_log_dir",
    "run",
    "worker_env",
]


def run(cfg: RunConfig) -> int:
    """Start the workers, supervise them, and return the group's exit code.

    With ``cfg.max_restarts``, a failed group is started again (fresh ports,
    ``MLDIST_RESTART`` counting up) so that a script using
    ``mldist.keras.Checkpoint`` resumes from its last checkpoint. SIGQUIT (Ctrl-\\) prints
    where every rank is, its collective and its frames, and the run goes on.

    Args:
        cfg: what to run.

    Example::

        code = run(RunConfig(nprocs=2, command=("python", "train.py"), max_restarts=2))
    """
    cfg, env, kind, record = _prepare(cfg)
    rounds = _Rounds(cfg, env, kind)
    current, received = rounds.groups, rounds.received

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        if current:
            current[-1].signal_all(signum)

    def on_quit(_signum: int, _frame: object) -> None:
        if current:
            current[-1].show_progress()

    old = {s: signal.signal(s, on_signal) for s in FORWARDED}
    old[signal.SIGQUIT] = signal.signal(signal.SIGQUIT, on_quit)  # as the JVM's thread dump: print, go on
    supervisor = elastic.Supervisor(rounds)  # the one loop of elastic runs, fixed worlds' restarts too
    try:
        return _formed(supervisor.run().code, rounds.never, env)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        code = rounds.code
        if cfg.elastic is not None and code != 0:
            elastic.forget((h for g in current for h, _ in g.cfg.hosts), env)
        if record is not None:
            reformed = [r.record() for r in supervisor.reforms]
            procs = current[-1].procs if current else []
            dropped = sorted({name for g in current for name in g.run_logs.dropped})
            record.end(code, procs, max(len(current) - 1, 0), received, rounds.never, reformed, dropped)


class _Rounds:
    """The supervisor's hooks for ``mldist run`` (:class:`mldist.launch.elastic.Supervisor`): one group a
    round; after a failure the same world again (``--max-restarts``) or, elastic, a re-formed one.

    ``groups`` holds every round's group, ``received`` the signals the launcher got, ``code`` and
    ``never`` the last round's exit code and never-formed line (:mod:`mldist.base.joined`).
    """

    def __init__(self, cfg: RunConfig, env: Mapping[str, str], kind: type[Group]) -> None:
        self.cfg, self.env, self.kind = cfg, env, kind
        self.groups: list[Group] = []
        self.received: list[int] = []
        self.failures: list[str] = []
        self.code: int | None = None
        self.failure: str | None = None
        self.never = ""

    def start(self, number: int, reform: elastic.Reform | None) -> Group:
        self.groups.append(self.kind(self.cfg, self.env, restart=number, reform=reform))
        return self.groups[-1]

    def monitor(self, group: Group) -> tuple[elastic.WorkerState, int]:
        """The round to its end (:func:`_round`), and where that leaves the world."""
        code, self.failure, self.never = _round(self.cfg, group, self.received, self.env)
        self.code, state = code, elastic.WorkerState
        if self.failure is None:
            return (state.SUCCEEDED if code == 0 else state.STOPPED), code
        if code == REQUEUE_CODE or any(s in STOPPING for s in self.received):
            return state.STOPPED, code
        return (state.LEAVING if self.cfg.elastic is not None and code == REFORM_CODE else state.FAILED), code

    def probe(self, group: Group) -> dict[str, bool]:
        """An elastic world's hosts, over mpiexec's ssh; a fixed world asks before its restart (:func:`_round`)."""
        return elastic.answering([h for h, _ in group.cfg.hosts], self.env) if self.cfg.elastic is not None else {}

    def stop(self, group: Group, answered: Mapping[str, bool], code: int) -> int:
        return code  # all or nothing: _round ended every worker already

    def recover(
        self, group: Group, state: elastic.WorkerState, code: int, answered: Mapping[str, bool], reformed: int
    ) -> elastic.Recovery:
        """The next round's config (:func:`_next_round`), or the end with the round's code."""
        nxt, done = _next_round(self.cfg, group, code, self.failure, self.failures, reformed, self.received, self.env,
                                answered)  # fmt: skip
        self.cfg = nxt or self.cfg
        return elastic.Recovery(done, nxt is not None, code)


def _round(cfg: RunConfig, group: Group, received: list[int], env: Mapping[str, str]) -> tuple[int, str | None, str]:
    """Start the group and supervise it to its end: (exit code, first failure, the never-formed line).

    An elastic run with a discovery script watches it meanwhile (:class:`mldist.launch.elastic.Watch`).
    """
    watch = elastic.Watch(cfg, env, group.restart) if cfg.elastic is not None and cfg.elastic.discovery else None
    try:
        if group.restart and cfg.elastic is None and _over_ssh(cfg):  # a restart: has a host gone meanwhile?
            try:
                answering_hosts(cfg, env)
            except LaunchError as exc:
                say(str(exc))
                return LOST_HOST_CODE, str(exc), ""
        group.start()
        if watch is not None:
            watch.start()
        code, failure = _supervise(cfg, group, received)
        # Asked only of a run that succeeded (a failed one said why already), before the notes directory goes.
        return code, failure, joined.line(joined.read(group.progress), cfg.nprocs) if code == 0 else ""
    finally:
        if watch is not None:
            watch.stop()
        group.finish()


def _next_round(
    cfg: RunConfig,
    group: Group,
    code: int,
    failure: str | None,
    failures: list[str],
    reformed: int,
    received: list[int],
    env: Mapping[str, str],
    answered: Mapping[str, bool],
) -> tuple[RunConfig | None, elastic.Reform | None]:
    """After a round: the next one's config (the same world restarted, or a re-formed elastic one), or
    None to end, and an elastic run's record of the re-forming. ``failures`` grows with each new round;
    ``reformed``: how many times the world re-formed before; ``answered``: the supervisor's probe."""
    stopping = any(s in STOPPING for s in received)
    if failure is None or code == REQUEUE_CODE or stopping:
        return None, None
    failures.append(failure)
    if cfg.elastic is not None and code == REFORM_CODE:  # the workers left at a commit for hosts that joined
        return elastic.grow(cfg, env, reformed, group.failed_at or time.monotonic())
    if cfg.elastic is not None:  # re-form on the hosts that remain, or end
        seen = group.failed_at or time.monotonic()
        asked_to_stop = lambda: any(s in STOPPING for s in received)  # noqa: E731
        return elastic.reform(cfg, group.named_lines, env, asked_to_stop, reformed, seen, answered)
    if len(failures) > cfg.max_restarts:
        if cfg.max_restarts:
            say(f"giving up after {cfg.max_restarts} restart(s); failures: " + "; ".join(failures))
        return None, None
    say(f"restarting the group ({len(failures)} of {cfg.max_restarts}) after: {failure}")
    return cfg, None


def _formed(code: int, never: str, env: Mapping[str, str]) -> int:
    """The run's exit code after saying that its workers never formed a group (``never``: the line, or "").
    ``MLDIST_REQUIRE_GROUP=1`` makes it an error."""
    if not never:
        return code
    if joined.required(env):
        say(f"error: {never}; failing the run ({joined.REQUIRE_ENV}=1, --require-group)")
        return 1
    say(f"{never}; --require-group makes this an error")
    return code


def _prepare(cfg: RunConfig) -> tuple[RunConfig, dict[str, str], type[Group], Record | None]:
    """Before any worker starts: the checks, the engine decision (carried in the config from here on),
    the workers' environment, how they start, and the run directory's record."""
    if cfg.log_dir:
        prepare_log_dir(cfg.log_dir)
    hosts = len(cfg.hosts)  # on hosts: mpiexec's daemons carry the ranks' output; the launcher's files grow with hosts
    ensure_descriptors(cfg.nprocs, (descriptor_plan(hosts, -(-cfg.nprocs // hosts))["total"], hosts) if hosts else None)
    env = inherited(cfg)
    decision, kind = launch_plan(cfg, env)
    cfg.check_backend(decision)
    if not cfg.hosts and (problem := command_problem(cfg.command[0], env.get("PATH"))):
        raise LaunchError(problem)  # a directory, a script without +x: said before anything starts
    if cfg.mpi_args and kind in (MpiexecGroup, RemoteGroup, NodefileGroup) and (found := find_mpiexec(env)):
        check_mpi_args(found, cfg.mpi_args, env)
    cfg = dataclasses.replace(cfg, decision=decision)
    if _over_ssh(cfg):  # before anything starts: mpiexec would wait for ever on a host that does not answer
        cfg = answering_hosts(cfg, env)
    if cfg.elastic is not None:  # the workers' commits of this run, on each host (mldist.horovod.elastic)
        cfg = dataclasses.replace(cfg, env={**cfg.env, elastic.RUN_ENV: uuid.uuid4().hex[:16]})
        env = {**env, elastic.RUN_ENV: cfg.env[elastic.RUN_ENV]}
    if cfg.cpu_bind == "none" and not cfg.hosts:  # bound or remote workers size their threads from their CPUs
        note = thread_plan(env, cfg.nprocs).note  # e.g. an OMP_NUM_THREADS=1 inherited from the shell
        if note:
            say(f"note: {note}")
    if kept := common.kept_note(env):
        say(f"note: {kept}")
    if cfg.nprocs > 1 and (strategy := common.strategy_note(env, decision.traits.runs_tensorflow)):
        say(f"note: {strategy}")
    started_by = "mpiexec" if kind is MpiexecGroup else "direct"
    return cfg, env, kind, Record(cfg, started_by, env) if cfg.run_dir else None


def _over_ssh(cfg: RunConfig) -> bool:
    """Whether mpiexec reaches the hosts of ``cfg`` over ssh (``-H``, ``--hostfile``; not an allocation's)."""
    return bool(cfg.hosts) and cfg.allocation is None


def inherited(cfg: RunConfig) -> dict[str, str]:
    """The environment the workers inherit: this process's, plus ``cfg.env``.

    The launcher's one read of ``os.environ`` (tests/test_layout.py keeps it so): everything
    it decides and starts takes this mapping, and its own environment stays as it was.

    Example:
        >>> inherited(RunConfig(nprocs=2, command=("python",), env={"KERAS_BACKEND": "jax"}))["KERAS_BACKEND"]
        'jax'
    """
    return {**os.environ, **cfg.env}


def launch_plan(cfg: RunConfig, env: Mapping[str, str]) -> tuple[engines.Decision, type[Group]]:
    """The engine, decided by :func:`mldist.placement.engines.decide` from what this host shows, and
    how the workers start: through mpiexec when they must form one MPI world, else directly.

    The workers get the whole decision (:mod:`mldist.placement.handed`) and take it where it fits them.

    Args:
        cfg: what to run.
        env: the workers' inherited environment (:func:`inherited`).
    """
    facts = engines.gather(
        cfg.communication,
        env,
        rank=0,
        size=cfg.nprocs,
        launcher="mldist",
        gpu=engines.gpu_device_nodes(),
        mpi=lambda: _world_to_form(cfg.nprocs, env),
    )
    decision = engines.decide(facts)
    if cfg.allocation is not None and cfg.allocation.scheduler in SRUN_STARTED:  # srun reaches the nodes itself
        return decision, GROUPS[cfg.allocation.scheduler]
    if cfg.hosts:  # mpiexec starts them whatever the engine: it is the only way onto the other hosts
        if isinstance(world := _world_to_form(cfg.nprocs, env), str):
            job = cfg.allocation
            who = f"inside {job.scheduler} job {job.job_id}, mpiexec" if job is not None else "-H/--hostfile: mpiexec"
            raise ConfigError(f"{who} starts the workers on the other hosts, but {world} (or --local: this node only)")
        return decision, GROUPS[cfg.allocation.scheduler] if cfg.allocation is not None else RemoteGroup
    return decision, MpiexecGroup if decision.mpi_world else DirectGroup


def _world_to_form(nprocs: int, env: Mapping[str, str]) -> engines.MpiWorld | str:
    """The MPI world mpiexec would give the workers, or why there would be none."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install 'mldist[cpu]')"
    found = find_mpiexec(env)
    if found is None:
        return "no mpiexec beside Python or on PATH (pip install 'mldist[cpu]')"
    return engines.MpiWorld(0, nprocs, f"mpiexec {found}")


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
