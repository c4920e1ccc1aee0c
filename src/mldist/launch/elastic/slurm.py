"""Inside an elastic Slurm job: start the ranks with srun, and re-form them on the nodes left after a loss.

``mldist submit --nodes 3 --min-nodes 2`` (or ``--nodes 2-4``) writes ``#SBATCH --no-kill``: Slurm
keeps the allocation when a node fails. The batch script hands its srun line to this agent
(``python3 -m mldist.launch.batch.agent``, a thin entry point), which runs it over the allocation's
nodes through the one elastic supervisor (:mod:`.supervisor`). When srun says that a task ended badly
or a node failed, the agent asks every node of the step, with a one-task step of ``true`` each,
whether it answers; the nodes that do not are lost. At or above ``--min-nodes`` nodes left, it stops
the step and starts a new one on the rest (``MLDIST_RESTART`` counting up, the ranks numbered anew);
the workers' elastic state (``hvd.elastic``, ``mldist.keras.Elastic``) resumes from its last commit.
Below it, the job ends with exit code 75 under ``--requeue`` (the script then requeues it), else with
the step's code. A failure while every node answers ends the job as a fixed world's would.

The agent runs with the script's python3 (mldist there) and prints its lines into the batch log.

Example::

    python3 -m mldist.launch.batch.agent --min-nodes 2 --tasks-per-node 1 -- \\
        srun --kill-on-bad-exit=1 --nodes=3 --ntasks=3 python train.py
"""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import IO

from ...base import envvalues, rejoin
from ...base.rundir import now_iso
from ...errors import REQUEUE_CODE
from ..rundir import elastic_job_summary
from .supervisor import Recovery, Reform, Supervisor, WorkerState, named, probe, write_reforms

#: srun's lines that start a loss check: a task that ended badly, or a node Slurm gave up on.
TROUBLE = re.compile(r"srun: error: (?:Node failure on (\S+)|(\S+): tasks? [0-9,-]+: )")
#: Seconds a node may take to run one ``true`` step before it counts as lost: at most PROBE_TIMEOUT, else
#: PROBE_FACTOR times the slowest node that answered, at least PROBE_GRACE (:func:`probe_limit`).
PROBE_TIMEOUT, PROBE_GRACE, PROBE_FACTOR = 10.0, 2.0, 5.0
#: Seconds srun gets to end its step after the agent stopped it, before SIGKILL (srun waits for the lost
#: node's tasks to the end of Slurm's own timeout: the agent cancels the step through the controller instead).
STOP_GRACE = 1.0
#: The srun options the agent decides each round.
_DECIDED = ("--nodes=", "--ntasks=", "--nodelist=", "--overlap")
#: The elastic run's id for the workers (where each node keeps their commits: mldist.checkpoint.commits).
RUN_ENV = rejoin.RUN_ENV


def round_argv(srun: Sequence[str], nodes: Sequence[str], tasks_per_node: int, again: bool) -> list[str]:
    """The srun line of one round: on ``nodes``, ``tasks_per_node`` ranks each.

    Args:
        srun: the batch script's srun line (its ``--nodes``/``--ntasks`` are replaced).
        nodes: the nodes of this round.
        tasks_per_node: ranks per node.
        again: a round after a loss: ``--overlap``, since the lost step may hold its CPUs until Slurm
            hears from the lost node.

    Example:
        >>> round_argv(["srun", "--nodes=3", "--ntasks=6", "python", "t.py"], ["n1", "n2"], 2, True)
        ['srun', '--nodes=2', '--ntasks=4', '--nodelist=n1,n2', '--overlap', 'python', 't.py']
    """
    rest = [w for w in srun[1:] if not w.startswith(_DECIDED)]
    decided = [f"--nodes={len(nodes)}", f"--ntasks={len(nodes) * tasks_per_node}", f"--nodelist={','.join(nodes)}"]
    return [srun[0], *decided, *(["--overlap"] if again else []), *rest]


def step_argv(nodes: Sequence[str], command: Sequence[str]) -> list[str]:
    """A step of one task per node of ``nodes`` running ``command``, beside the job's steps (``--overlap``).

    Example:
        >>> step_argv(["n3"], ["true"])[-2:]
        ['--nodelist=n3', 'true']
    """
    n = len(nodes)
    return [
        "srun",
        "--overlap",
        f"--nodes={n}",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        "--cpus-per-task=1",
        "--mpi=none",
        "--kill-on-bad-exit=1",
        f"--nodelist={','.join(nodes)}",
        *command,
    ]


def probe_limit(answered_in: Sequence[float], timeout: float = PROBE_TIMEOUT) -> float:
    """Seconds to wait for a node's probe: :data:`PROBE_FACTOR` times the slowest answer of the nodes that
    answered (the controller's pace now), at least :data:`PROBE_GRACE`, at most ``timeout``.

    Example:
        >>> probe_limit([0.06, 0.08]), probe_limit([1.5]), probe_limit([])
        (2.0, 7.5, 10.0)
    """
    if not answered_in:
        return timeout
    return min(timeout, max(PROBE_GRACE, PROBE_FACTOR * max(answered_in)))


def answering(nodes: Sequence[str], env: Mapping[str, str], timeout: float = PROBE_TIMEOUT) -> dict[str, bool]:
    """Whether each node runs a ``true`` step in time (:func:`probe_limit`; asked in parallel)."""
    return probe(nodes, lambda node: step_argv([node], ["true"]), env, lambda took: probe_limit(took, timeout))


def job_nodes(env: Mapping[str, str]) -> list[str]:
    """The allocation's nodes, in order (``scontrol show hostnames $SLURM_JOB_NODELIST``)."""
    listed = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    res = subprocess.run(["scontrol", "show", "hostnames", listed], capture_output=True, text=True, env=dict(env))
    nodes = res.stdout.split()
    if res.returncode != 0 or not nodes:
        raise SystemExit(f"mldist: cannot list the job's nodes ({listed!r}): {res.stderr.strip()[:200]}")
    return nodes


class Round:
    """One srun step: its stderr passed on line by line, and the first line that calls for a loss check."""

    def __init__(self, argv: list[str], env: Mapping[str, str], nodes: Sequence[str]) -> None:
        self.nodes = list(nodes)
        self.trouble = threading.Event()
        self.trouble_at = 0.0  # time.monotonic() of srun's first line of trouble
        self.proc = subprocess.Popen(argv, env=dict(env), stderr=subprocess.PIPE, text=True, errors="replace")
        assert self.proc.stderr is not None
        self.reader = threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True)
        self.reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            sys.stderr.write(line)
            sys.stderr.flush()
            if named([line], (TROUBLE,)) and not self.trouble.is_set():
                self.trouble_at = time.monotonic()
                self.trouble.set()

    def stop(self, env: Mapping[str, str]) -> int:
        """End the step: SIGTERM to srun, SIGKILL after :data:`STOP_GRACE`, then ``scancel`` of the job's steps
        (what ran on the nodes left ends for sure before the next step starts); srun's exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        code = self.proc.wait()
        job = env.get("SLURM_JOB_ID", "")
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            listed = subprocess.run(
                ["squeue", "-h", "-s", "-j", job, "-o", "%i"], capture_output=True, text=True, timeout=30, env=dict(env)
            ).stdout.split()
            steps = [step for step in listed if re.fullmatch(rf"{re.escape(job)}\.[0-9]+", step)]
            if steps:
                subprocess.run(["scancel", "--quiet", *steps], capture_output=True, timeout=30, env=dict(env))
        return code


def say(line: str) -> None:
    print(f"mldist: {line}", flush=True)


class SlurmHooks:
    """The supervisor's hooks for an elastic Slurm job: srun steps over the nodes that remain."""

    def __init__(
        self, srun: list[str], min_nodes: int, tasks_per_node: int, requeue: bool, env: Mapping[str, str]
    ) -> None:
        self.srun, self.min_nodes, self.tasks_per_node, self.requeue = srun, min_nodes, tasks_per_node, requeue
        self.env = env
        self.nodes = job_nodes(env)
        self.rounds: list[Round] = []

    def start(self, number: int, reform: Reform | None) -> Round:
        argv = round_argv(self.srun, self.nodes, self.tasks_per_node, again=number > 0)
        self.rounds.append(Round(argv, {**self.env, envvalues.RESTART.name: str(number)}, self.nodes))
        return self.rounds[-1]

    def monitor(self, step: Round) -> tuple[WorkerState, int]:
        """Wait for the step's end, or srun's first line of trouble."""
        while step.proc.poll() is None and not step.trouble.wait(0.2):
            pass
        code = step.proc.poll()
        return (WorkerState.SUCCEEDED, 0) if code == 0 else (WorkerState.FAILED, code or 0)

    def probe(self, step: Round) -> dict[str, bool]:
        """Every node of the step, asked once, at the first sign of trouble."""
        return answering(step.nodes, self.env)

    def stop(self, step: Round, answered: Mapping[str, bool], code: int) -> int:
        """A lost node: end the step now (:meth:`Round.stop`); else srun ends it (``--kill-on-bad-exit``)."""
        return step.stop(self.env) if not all(answered.values()) else step.proc.wait()

    def recover(
        self, step: Round, state: WorkerState, code: int, answered: Mapping[str, bool], reformed: int
    ) -> Recovery:
        """Re-form on the nodes that answered, or end the job (below ``--min-nodes``, or no node lost)."""
        lost = [node for node, ok in answered.items() if not ok]
        if not lost:
            return Recovery(None, False, code if code >= 0 else 128 - code)  # a signal as a shell reports it
        left = [n for n in step.nodes if n not in lost]
        words = f"lost node {', '.join(lost)} (it does not answer)"
        if len(left) < self.min_nodes:
            then = "requeueing the job (--requeue)" if self.requeue else "ending the job"
            say(f"{words}; {len(left)} node(s) left, below --min-nodes {self.min_nodes}: {then}")
            self.nodes = left
            return Recovery(None, False, REQUEUE_CODE if self.requeue else (code if code > 0 else 1))  # stopped: 1
        seen = step.trouble_at or time.monotonic()
        took = time.monotonic() - seen
        n = self.tasks_per_node
        say(
            f"{words}; re-forming the world on {','.join(left)}: {len(left) * n} worker(s) "
            f"(--min-nodes {self.min_nodes}), {took:.1f} s after srun reported it"
        )
        done = Reform(lost, "it does not answer", before=len(step.nodes) * n, seen_at=seen, after=len(left) * n)
        done.hosts_checked_s = round(took, 3)
        self.nodes = left
        return Recovery(done, True, code)

    def forward(self, signum: int, _frame: object) -> None:
        """The script's TERM/INT/USR1 reach the running step."""
        if self.rounds and self.rounds[-1].proc.poll() is None:
            self.rounds[-1].proc.send_signal(signum)


def ended(code: int, nodes: Sequence[str], env: Mapping[str, str]) -> int:
    """``code``; after a failure, the run's commits are first removed from the memory of ``nodes``."""
    if code != 0 and nodes and (run_id := envvalues.ELASTIC_ID.read(env)):
        argv = step_argv(nodes, ["sh", "-c", rejoin.forget_command(env, run_id)])
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(argv, env=dict(env), capture_output=True, timeout=30, check=False)
    return code


def run(srun: list[str], min_nodes: int, tasks_per_node: int, requeue: bool, env: Mapping[str, str]) -> int:
    """Rounds of ``srun`` over the nodes that remain, until one ends without a lost node; its exit code."""
    env = {**env, RUN_ENV: uuid.uuid4().hex[:16]}  # where each node keeps the workers' commits
    hooks = SlurmHooks(srun, min_nodes, tasks_per_node, requeue, env)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(s, hooks.forward)
    started, t0 = now_iso(), time.monotonic()
    run_dir = envvalues.RUN_DIR.read(env)
    result = Supervisor(hooks, lambda reforms: write_reforms(run_dir, reforms)).run()
    code = ended(result.code, hooks.nodes, env)
    if run_dir:  # the same record as mldist run -H's summary.json, at the end
        with contextlib.suppress(OSError):  # the job's exit code matters more than its summary
            reforms = [r.record() for r in result.reforms]
            ranks = len(hooks.nodes) * tasks_per_node
            elastic_job_summary(run_dir, code, started, time.monotonic() - t0, ranks, reforms, min_nodes=min_nodes)
    return code


def main(argv: list[str], env: Mapping[str, str]) -> int:
    """``python -m mldist.launch.batch.agent --min-nodes M --tasks-per-node T [--requeue] -- srun ...`` in the
    environment ``env`` (the batch script's)."""
    p = argparse.ArgumentParser(prog="python -m mldist.launch.batch.agent", description=__doc__.split("\n")[0])
    p.add_argument("--min-nodes", type=int, required=True)
    p.add_argument("--tasks-per-node", type=int, required=True)
    p.add_argument("--requeue", action="store_true")
    p.add_argument("srun", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    srun = args.srun[1:] if args.srun[:1] == ["--"] else args.srun
    if not srun or args.min_nodes < 1 or args.tasks_per_node < 1:
        p.error("give --min-nodes and --tasks-per-node of at least 1, then -- and the srun line")
    return run(srun, args.min_nodes, args.tasks_per_node, args.requeue, env)
