"""Inside an elastic Slurm job: start the ranks with srun, and re-form them on the nodes left after a loss.

``mldist submit --nodes 3 --min-nodes 2`` (or ``--nodes 2-4``) writes ``#SBATCH --no-kill``: Slurm
keeps the allocation when a node fails. The batch script hands its srun line to this agent, which
runs it over the allocation's nodes. When srun says that a task ended badly or a node failed, the
agent asks every node of the step, with a one-task step of ``true`` each, whether it answers; the
nodes that do not are lost. At or above ``--min-nodes`` nodes left, it stops the step and starts a
new one on the rest (``MLDIST_RESTART`` counting up, the ranks numbered anew); the workers' elastic
state (``hvd.elastic``, ``mldist.keras.Elastic``) resumes from its last commit. Below it, the job ends
with exit code 75 under ``--requeue`` (the script then requeues it), else with the step's code. A
failure while every node answers ends the job as a fixed world's would.

The agent runs with the script's python3 (mldist there) and prints its lines into the batch log.

Example::

    python3 -m mldist.launch.batch.agent --min-nodes 2 --tasks-per-node 1 -- \\
        srun --kill-on-bad-exit=1 --nodes=3 --ntasks=3 python train.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from ...base import rejoin
from ...base.files import atomic_write
from ...errors import REQUEUE_CODE
from ..elastic import RUN_ENV

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
    return ["srun", "--overlap", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", "--cpus-per-task=1",
            "--mpi=none", "--kill-on-bad-exit=1", f"--nodelist={','.join(nodes)}", *command]  # fmt: skip


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
    t0 = time.monotonic()
    found: dict[str, tuple[bool, float]] = {}  # node: (answered, seconds it took)
    probes = {
        node: subprocess.Popen(
            step_argv([node], ["true"]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(env)
        )
        for node in nodes
    }
    while len(found) < len(probes):
        took = time.monotonic() - t0
        found |= {
            node: (p.returncode == 0, took) for node, p in probes.items() if node not in found and p.poll() is not None
        }
        if took > probe_limit([t for ok, t in found.values() if ok], timeout):
            break
        time.sleep(0.02)
    for node, p in probes.items():
        if node not in found:  # still launching on a node that does not answer
            p.kill()
            p.wait()
    return {node: found.get(node, (False, 0.0))[0] for node in nodes}


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

    def __init__(self, argv: list[str], env: Mapping[str, str]) -> None:
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
            if TROUBLE.search(line) and not self.trouble.is_set():
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
            listed = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"], capture_output=True, text=True,
                                    timeout=30, env=dict(env)).stdout.split()  # fmt: skip
            steps = [step for step in listed if re.fullmatch(rf"{re.escape(job)}\.[0-9]+", step)]
            if steps:
                subprocess.run(["scancel", "--quiet", *steps], capture_output=True, timeout=30, env=dict(env))
        return code


def supervise(step: Round, nodes: Sequence[str], env: Mapping[str, str]) -> tuple[int, list[str]]:
    """Wait for the step; its exit code and the nodes lost (checked once, at the first sign of trouble)."""
    while step.proc.poll() is None and not step.trouble.wait(0.2):
        pass
    if step.proc.poll() == 0:
        return 0, []
    lost = [node for node, ok in answering(nodes, env).items() if not ok]
    code = step.stop(env) if lost else step.proc.wait()
    return code, lost


def say(line: str) -> None:
    print(f"mldist: {line}", flush=True)


def record(run_dir: str | None, reforms: list[dict[str, object]]) -> None:
    """The re-formings so far, in ``<run dir>/elastic.json`` (owner-only, written whole)."""
    if run_dir:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        atomic_write(Path(run_dir) / "elastic.json", json.dumps({"reforms": reforms}, indent=1) + "\n", mode=0o600)


def ended(code: int, nodes: Sequence[str], env: Mapping[str, str]) -> int:
    """``code``; after a failure, the run's commits are first removed from the memory of ``nodes``."""
    if code != 0 and nodes:
        argv = step_argv(nodes, ["sh", "-c", rejoin.forget_command(env, env[RUN_ENV])])
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(argv, env=dict(env), capture_output=True, timeout=30, check=False)
    return code


def run(srun: list[str], min_nodes: int, tasks_per_node: int, requeue: bool, env: Mapping[str, str]) -> int:
    """Rounds of ``srun`` over the nodes that remain, until one ends without a lost node; its exit code."""
    nodes = job_nodes(env)
    rounds: list[Round] = []

    def forward(signum: int, _frame: object) -> None:  # the script's TERM/INT/USR1 reach the running step
        if rounds and rounds[-1].proc.poll() is None:
            rounds[-1].proc.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(s, forward)
    elastic_id = uuid.uuid4().hex[:16]  # where each node keeps the workers' commits (mldist.checkpoint.commits)
    env = {**env, RUN_ENV: elastic_id}
    reforms: list[dict[str, object]] = []
    while True:
        step = Round(
            round_argv(srun, nodes, tasks_per_node, bool(reforms)), {**env, "MLDIST_RESTART": str(len(reforms))}
        )
        rounds.append(step)
        code, lost = supervise(step, nodes, env)
        if not lost:
            return ended(code if code >= 0 else 128 - code, nodes, env)  # a signal as a shell reports it
        left = [n for n in nodes if n not in lost]
        words = f"lost node {', '.join(lost)} (it does not answer)"
        if len(left) < min_nodes:
            then = "requeueing the job (--requeue)" if requeue else "ending the job"
            say(f"{words}; {len(left)} node(s) left, below --min-nodes {min_nodes}: {then}")
            return ended(REQUEUE_CODE if requeue else (code if code > 0 else 1), left, env)  # srun stopped: 1
        took = time.monotonic() - (step.trouble_at or time.monotonic())
        say(f"{words}; re-forming the world on {','.join(left)}: {len(left) * tasks_per_node} worker(s) "
            f"(--min-nodes {min_nodes}), {took:.1f} s after srun reported it")  # fmt: skip
        reforms.append({"lost": lost, "before": len(nodes) * tasks_per_node, "after": len(left) * tasks_per_node,
                        "restart_s": round(took, 3)})  # fmt: skip
        record(env.get("MLDIST_RUN_DIR"), reforms)
        nodes = left


def main(argv: list[str]) -> int:
    """``python -m mldist.launch.batch.agent --min-nodes M --tasks-per-node T [--requeue] -- srun ...``."""
    p = argparse.ArgumentParser(prog="python -m mldist.launch.batch.agent", description=__doc__.split("\n")[0])
    p.add_argument("--min-nodes", type=int, required=True)
    p.add_argument("--tasks-per-node", type=int, required=True)
    p.add_argument("--requeue", action="store_true")
    p.add_argument("srun", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    srun = args.srun[1:] if args.srun[:1] == ["--"] else args.srun
    if not srun or args.min_nodes < 1 or args.tasks_per_node < 1:
        p.error("give --min-nodes and --tasks-per-node of at least 1, then -- and the srun line")
    return run(srun, args.min_nodes, args.tasks_per_node, args.requeue, os.environ)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
