"""The local launcher behind ``mldist run``: N workers on this host, supervised.

All-or-nothing, like torchrun: if one worker fails, the others get SIGTERM
and, after a short grace, SIGKILL; the group's exit code is the first
failing worker's. Signals to the launcher are forwarded to every worker.
Each worker runs in its own session, so its whole process tree is
signalled and nothing is left behind.

:func:`run` works out the first round once (:class:`mldist.launch.rounds.Round`: the decision, the
workers' environment, how they start) and runs the rounds: a fixed world in a plain loop (one round;
``--max-restarts`` more after failures), an elastic one (``--min-np``, ``--host-discovery-script``) in
the one elastic supervisor (:class:`mldist.launch.elastic.Supervisor`), whose hooks re-form the world.

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
import functools
import importlib.util
import os
import signal
import time
import uuid
from collections.abc import Mapping, Sequence

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
from .procs import FORWARDED, cpu_sets, say, worker_env
from .remote import RemoteGroup, answering_hosts
from .rounds import Ended, Round, Tally, failure_order, over_ssh, play
from .rundir import Record

#: The launcher's names and, re-exported, those of config, procs and rounds that callers import from here.
__all__ = [
    "FORWARDED",
    "MAX_WORKERS",
    "NETWORKS",
    "RunConfig",
    "cpu_sets",
    "ensure_descriptors",
    "failure_order",
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
    first, record = _prepare(cfg)
    tally = Tally()

    def on_signal(signum: int, _frame: object) -> None:
        tally.received.append(signum)
        if tally.groups:
            tally.groups[-1].signal_all(signum)

    def on_quit(_signum: int, _frame: object) -> None:
        if tally.groups:
            tally.groups[-1].show_progress()

    old = {s: signal.signal(s, on_signal) for s in FORWARDED}
    old[signal.SIGQUIT] = signal.signal(signal.SIGQUIT, on_quit)  # as the JVM's thread dump: print, go on
    reforms: list[elastic.Reform] = []
    try:
        if first.cfg.elastic is None:
            code = _plain(first, tally)
        else:  # the one elastic supervisor (an elastic Slurm job's agent runs it too)
            supervisor = elastic.Supervisor(_Elastic(first, tally))
            reforms = supervisor.reforms
            code = supervisor.run().code
        return _formed(code, tally.never, first.env)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        _end(first, tally, reforms, record)


def _plain(rnd: Round, tally: Tally) -> int:
    """A fixed world: one round and, after a failure, the same world again up to ``--max-restarts``
    (fresh ports, ``MLDIST_RESTART`` counting up); the last round's exit code."""
    failures: list[str] = []
    while True:
        ended = play(rnd, tally)
        if not _again(rnd.cfg, ended, failures, tally):
            return ended.code
        rnd = rnd.next()


def _again(cfg: RunConfig, ended: Ended, failures: list[str], tally: Tally) -> bool:
    """Whether a fixed world starts again after the round that ``ended``; ``failures``, every round's so far,
    grows with its failure. Not after a success, an exit 75 (a requeue) or a signal to stop."""
    if ended.failure is None or ended.code == REQUEUE_CODE or tally.stopping():
        return False
    failures.append(ended.failure)
    if len(failures) > cfg.max_restarts:
        if cfg.max_restarts:
            say(f"giving up after {cfg.max_restarts} restart(s); failures: " + "; ".join(failures))
        return False
    say(f"restarting the group ({len(failures)} of {cfg.max_restarts}) after: {ended.failure}")
    return True


class _Elastic:
    """The elastic supervisor's hooks for ``mldist run --min-np``/``--host-discovery-script``
    (:class:`mldist.launch.elastic.Supervisor`): a round is :func:`mldist.launch.rounds.play`; after a failure
    the world re-forms on the hosts that answer; after the workers left for hosts that joined, it grows."""

    def __init__(self, first: Round, tally: Tally) -> None:
        self.next, self.tally = first, tally
        self.ended: Ended | None = None

    def start(self, number: int, reform: elastic.Reform | None) -> Round:
        return dataclasses.replace(self.next, number=number, reform=reform)

    def monitor(self, rnd: Round) -> tuple[elastic.WorkerState, int]:
        """The round to its end, and where that leaves the world."""
        ended = self.ended = play(rnd, self.tally)
        state, code = elastic.WorkerState, ended.code
        if ended.failure is None:
            return (state.SUCCEEDED if code == 0 else state.STOPPED), code
        if code == REQUEUE_CODE or self.tally.stopping():
            return state.STOPPED, code
        return (state.LEAVING if code == REFORM_CODE else state.FAILED), code

    def probe(self, rnd: Round) -> dict[str, bool]:
        """Whether each host of the round answers, over mpiexec's ssh."""
        return elastic.answering([h for h, _ in rnd.cfg.hosts], rnd.env)

    def stop(self, rnd: Round, answered: Mapping[str, bool], code: int) -> int:
        return code  # all or nothing: play() ended every worker already

    def recover(
        self, rnd: Round, state: elastic.WorkerState, code: int, answered: Mapping[str, bool], reformed: int
    ) -> elastic.Recovery:
        """The next world (grown, or re-formed on the hosts that remain), or the end with the round's code."""
        assert self.ended is not None
        group, tally = self.ended.group, self.tally
        if tally.stopping():
            return elastic.Recovery(None, False, code)
        seen = group.failed_at or time.monotonic()
        if state is elastic.WorkerState.LEAVING:  # the workers left at a commit for the hosts that joined
            nxt, done = elastic.grow(rnd.cfg, rnd.env, reformed, seen)
        else:
            nxt, done = elastic.reform(rnd.cfg, group.named_lines, rnd.env, tally.stopping, reformed, seen, answered)
        if nxt is not None:
            self.next = dataclasses.replace(rnd, cfg=nxt)
        return elastic.Recovery(done, nxt is not None, code)


def _end(first: Round, tally: Tally, reforms: Sequence[elastic.Reform], record: Record | None) -> None:
    """After the last round: a failed elastic run's commits forgotten on its hosts; the run directory's summary."""
    groups = tally.groups
    if first.cfg.elastic is not None and tally.code != 0:
        elastic.forget((h for g in groups for h, _ in g.cfg.hosts), first.env)
    if record is not None:
        procs = groups[-1].procs if groups else []
        dropped = sorted({name for g in groups for name in g.run_logs.dropped})
        reformed = [r.record() for r in reforms]
        record.end(tally.code, procs, max(len(groups) - 1, 0), tally.received, tally.never, reformed, dropped)


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


def _prepare(cfg: RunConfig) -> tuple[Round, Record | None]:
    """Before any worker starts: the checks and the first round (the engine decision, carried in its config
    from here on, the workers' environment, how they start), and the run directory's record."""
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
    if over_ssh(cfg):  # before anything starts: mpiexec would wait for ever on a host that does not answer
        cfg = answering_hosts(cfg, env)
    if cfg.elastic is not None:  # the workers' commits of this run, on each host (mldist.horovod.elastic)
        run_id = {elastic.RUN_ENV: uuid.uuid4().hex[:16]}
        cfg, env = dataclasses.replace(cfg, env={**cfg.env, **run_id}), {**env, **run_id}
    if cfg.cpu_bind == "none" and not cfg.hosts:  # bound or remote workers size their threads from their CPUs
        note = thread_plan(env, cfg.nprocs).note  # e.g. an OMP_NUM_THREADS=1 inherited from the shell
        if note:
            say(f"note: {note}")
    if kept := common.kept_note(env):
        say(f"note: {kept}")
    if cfg.nprocs > 1 and (strategy := common.strategy_note(env, decision.traits.runs_tensorflow)):
        say(f"note: {strategy}")
    started_by = "mpiexec" if kind is MpiexecGroup else "direct"
    return Round(cfg, env, kind), Record(cfg, started_by, env) if cfg.run_dir else None


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
    world = functools.cache(lambda: _world_to_form(cfg.nprocs, env))  # asked once, when the decision needs it
    facts = engines.gather(
        cfg.communication,
        env,
        rank=0,
        size=cfg.nprocs,
        launcher="mldist",
        gpu=engines.gpu_device_nodes(),
        mpi=world,
    )
    decision = engines.decide(facts)
    if cfg.allocation is not None and cfg.allocation.scheduler in SRUN_STARTED:  # srun reaches the nodes itself
        return decision, GROUPS[cfg.allocation.scheduler]
    if cfg.hosts:  # mpiexec starts them whatever the engine: it is the only way onto the other hosts
        if isinstance(why := world(), str):
            job = cfg.allocation
            who = f"inside {job.scheduler} job {job.job_id}, mpiexec" if job is not None else "-H/--hostfile: mpiexec"
            raise ConfigError(f"{who} starts the workers on the other hosts, but {why} (or --local: this node only)")
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
