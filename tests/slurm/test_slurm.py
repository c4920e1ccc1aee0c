"""mldist submit/status/logs/cancel against a real Slurm (two emulated nodes on this host).

The cluster comes from scripts/slurm-cluster.sh (the ``slurm_env`` fixture and the
``_submit``/``wait_for`` helpers are in this folder's conftest.py). Without root these
tests skip with the reason; with CI=true a cluster that cannot start is a failure.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from helpers import PY, ROOT, mldist, wait_for_progress
from helpers import wait_for as wait_until
from mldist.launch.elastic.supervisor import Reform

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
Submit = Callable[..., str]
Sbatch = Callable[..., tuple[str, str]]


def test_two_node_training_runs_to_completion(
    slurm_env: dict[str, str], tmp_path: Path, _submit: Submit, wait_for: Submit
) -> None:
    out = tmp_path / "job"
    example = ROOT / "examples" / "digits_cnn.py"
    job = _submit(
        slurm_env,
        "--scheduler", "slurm", "--nodes", "2", "--tasks-per-node", "1", "--time", "10",
        "--venv", str(ROOT / ".venv"), "--output-dir", str(out), "--job-name", "digits",
        "--", "python", str(example), "--epochs", "3", "--out", str(out / "results"),
    )  # fmt: skip
    status = wait_for(slurm_env, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})
    batch = mldist(["logs", job], env=slurm_env).stdout
    assert " COMPLETED " in f" {status} ", f"{status}\n{batch}"
    assert "job step ended with exit code 0" in batch
    seen = set()
    for rank in (0, 1):
        log = mldist(["logs", job, "--rank", str(rank)], env=slurm_env)
        assert log.returncode == 0, log.stderr
        m = re.search(r"rank (\d) of 2 on (\S+) \(launcher slurm\)", log.stdout)
        assert m, log.stdout[-2000:]
        if rank == 0:  # the MPI engine across the nodes: srun --mpi=pmix, detected when the job ran
            assert "collectives: mpi engine" in log.stdout, log.stdout[-3000:]
        assert "RING" not in log.stdout, log.stdout[-3000:]
        seen.add(int(m.group(1)))
        result = json.loads((out / "results" / f"result-rank{rank}.json").read_text())
        assert (result["rank"], result["size"], result["engine"]) == (rank, 2, "mpi")
    assert "mldist: srun MPI plugin: --mpi=pmix" in batch, batch
    assert seen == {0, 1}
    env_record = (out / f"environment-{job}.txt").read_text()
    assert "## pip freeze" in env_record and "tensorflow" in env_record
    # The job's run directory (MLDIST_RUN_DIR in the script): RunLog's metrics, one row per epoch.
    rows = (out / "run" / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 3, rows
    assert (out / "run" / "metrics.png").is_file()


def test_cancel_a_running_job(slurm_env: dict[str, str], tmp_path: Path, _submit: Submit, wait_for: Submit) -> None:
    job = _submit(slurm_env, "--output-dir", str(tmp_path / "sleeper"), "--", "sleep", "300")
    wait_for(slurm_env, job, {"RUNNING"}, timeout=120)
    res = mldist(["cancel", job], env=slurm_env)
    assert res.returncode == 0, res.stderr
    wait_for(slurm_env, job, {"CANCELLED"}, timeout=120)


def test_requeued_job_resumes_from_its_checkpoint_and_completes(
    slurm_env: dict[str, str], tmp_path: Path, _submit: Submit, wait_for: Submit
) -> None:
    """--requeue end to end: time-limit signal, save, exit 75, Slurm requeue, exact resume, COMPLETED."""
    out, train = tmp_path / "job", tmp_path / "train"
    train.mkdir()
    # Slurm sends USR1 at the first check (every 30 s) once fewer than grace + 30 s are left:
    # with a 120 s limit and 30 s grace, 60-90 s into each attempt. Attempt 0 sleeps 1 s per
    # step (96 steps, > 96 s: it cannot finish first, and training has started before 60 s);
    # attempt 1 does not sleep and must finish within 60 s, or it would be signalled too.
    job = _submit(
        slurm_env,
        "--scheduler", "slurm", "--nodes", "2", "--tasks-per-node", "1", "--requeue",
        "--time", "0:02:00", "--grace", "30",
        "--venv", str(ROOT / ".venv"), "--output-dir", str(out), "--job-name", "requeue",
        "--", str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "tests" / "workers" / "resume.py"), str(train),
        "--epochs", "6", "--sleep", "1", "--sleep-attempts", "1", "--check-every", "2",
    )  # fmt: skip
    status = wait_for(slurm_env, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=300)
    batch = mldist(["logs", job], env=slurm_env).stdout
    ranks = [mldist(["logs", job, "--rank", str(r)], env=slurm_env).stdout for r in (0, 1)]
    why = f"{status}\n{batch}\n--- rank 0\n{ranks[0][-3000:]}\n--- rank 1\n{ranks[1][-3000:]}"
    assert " COMPLETED " in f" {status} " and " restarts 1 " in f" {status} ", why

    # The cluster keeps finished jobs for MinJobAge=600 s (and has no accounting, so no
    # sacct): scontrol still shows the job after it completed.
    show = subprocess.run(["scontrol", "show", "job", job], env=slurm_env, capture_output=True, text=True, timeout=30)
    assert re.search(r"\bJobState=COMPLETED\b", show.stdout), show.stdout + show.stderr
    assert re.search(r"\bRestarts=1\b", show.stdout), show.stdout

    # One USR1 (attempt 0), its step exited 75 and requeued; attempt 1's step exited 0.
    assert batch.count("mldist: USR1: asking the workers to save and exit") == 1, why
    assert batch.count("mldist: srun MPI plugin: --mpi=pmix") == 2, why  # both attempts on the MPI engine
    for rank, log in enumerate(ranks):
        assert log.count(f"rank {rank} engine mpi") == 2, why
    assert "workers saved and asked to be requeued (exit 75)" in batch, why
    ends = re.findall(r"job step ended with exit code (\d+)", batch)
    assert ends == ["75", "0"], why
    for rank, log in enumerate(ranks):
        assert f"rank {rank}: got SIGUSR1; saving at the next step boundary" in log, why
        assert f"attempt 1 rank {rank}: finished at step 96" in log, why
    m = re.search(r"checkpoint saved at step (\d+); exiting with 75 to be requeued", ranks[0])
    assert m, why
    saved = int(m.group(1))
    assert 0 < saved < 96, why
    assert f"resuming from checkpoint step {saved}: epoch {saved // 16}" in ranks[0][m.end() :], why

    epochs = [[json.loads(line) for line in (train / f"epochs-rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    assert epochs[0] == epochs[1], epochs
    attempts = [e["attempt"] for e in epochs[0]]
    assert attempts == sorted(attempts) and set(attempts) == {0, 1}, epochs[0]
    first = next(e for e in epochs[0] if e["attempt"] == 1)
    # Resumed from attempt 0's checkpoint, not from scratch, and ran to the last epoch.
    assert first == {"attempt": 1, "epoch": saved // 16, "step": saved}, epochs[0]
    assert epochs[0][-1]["epoch"] == 5, epochs[0]

    weights = [np.load(train / f"weights-rank{r}.npy") for r in (0, 1)]
    assert weights[0].size > 0 and np.array_equal(weights[0], weights[1])


#: Each rank's world, node and an all-reduce of rank + 1 over the world (the MPI engine across the nodes).
PROBE = (
    "import os, mldist; ctx = mldist.init(); "
    "s = float(mldist.allreduce([float(ctx.rank + 1)], op='sum')[0]); "
    "print('RANK', ctx.rank, ctx.size, os.environ['SLURMD_NODENAME'], ctx.communication, s, flush=True)"
)


def _ranks(text: str) -> list[str]:
    return sorted(line.split("RANK ", 1)[1] for line in text.splitlines() if "RANK " in line)


def test_mldist_run_inside_an_allocation_spreads_over_its_nodes(
    slurm_env: dict[str, str], tmp_path: Path, sbatch: Sbatch
) -> None:
    """salloc -N 2 and an sbatch script: `mldist run` starts its ranks over both nodes through srun."""
    py, run = ROOT / ".venv" / "bin" / "python", ROOT / ".venv" / "bin" / "mldist"
    # -w: the node names below are asserted (the cluster has 4 nodes; others may be free first)
    salloc = [
        "salloc",
        "-N",
        "2",
        "-w",
        "node1,node2",
        "--ntasks-per-node=1",
        str(run),
        "run",
        "-n",
        "2",
        "--run-dir",
        str(tmp_path / "r"),
    ]
    res = subprocess.run([*salloc, "--", str(py), "-c", PROBE], env=slurm_env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert _ranks(res.stdout) == ["0 2 node1 mpi 3.0", "1 2 node2 mpi 3.0"], res.stdout + res.stderr
    assert re.search(r"inside Slurm job \d+: 2 worker\(s\) over node1,node2 through srun", res.stderr), res.stderr
    assert "RANK 1 2 node2" in (tmp_path / "r" / "rank-1.log").read_text()  # the run directory as ever
    # Leave-fast as ever: rank 1 fails on node2, rank 0 (sleeping on node1) is stopped; the run names rank 1.
    fails = "import os, sys, time; time.sleep(120) if os.environ['RANK'] == '0' else sys.exit(3)"
    started = time.monotonic()
    res = subprocess.run([*salloc[:-2], "--no-run-dir", "--", str(py), "-c", fails], env=slurm_env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 3 and time.monotonic() - started < 60, res.stdout + res.stderr
    assert re.search(r"rank 1 exited with code 3 on \S+; stopping the other workers", res.stderr), res.stderr

    # In a batch script: -n defaults to the job's tasks; more is refused in one line; --local stays here.
    out, script = tmp_path / "out.txt", tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/bash\n#SBATCH -N 2 -w node1,node2 --ntasks-per-node=1 -o {out}\n"
        f'{run} run --no-run-dir -- {py} -c "{PROBE}"\necho EXIT $?\n'
        f"{run} run -n 3 --no-run-dir -- true\necho REFUSED $?\n"
        f'{run} run --local -n 2 --no-run-dir -- {py} -c "{PROBE}" | sed s/RANK/LOCAL/\n'
    )
    state, text = sbatch(slurm_env, script, out)
    assert state == "COMPLETED" and "EXIT 0" in text and "REFUSED 2" in text, f"{state}\n{text}"
    assert _ranks(text) == ["0 2 node1 mpi 3.0", "1 2 node2 mpi 3.0"], text
    assert re.search(r"-n 3 is more than the 2 task\(s\) of slurm job \d+ \(2 node\(s\)\)", text), text
    local = sorted(line.split("LOCAL ", 1)[1] for line in text.splitlines() if "LOCAL " in line)
    assert local == ["0 2 node1 mpi 3.0", "1 2 node1 mpi 3.0"], text


def test_stacks_shows_every_rank_of_a_running_two_node_job(
    slurm_env: dict[str, str], tmp_path: Path, _submit: Submit, wait_for: Submit
) -> None:
    out = tmp_path / "job"
    job = _submit(
        slurm_env,
        "--scheduler", "slurm", "--nodes", "2", "--tasks-per-node", "1", "--time", "5",
        "--venv", str(ROOT / ".venv"), "--output-dir", str(out), "--job-name", "steady",
        "--", "python", str(ROOT / "tests" / "workers" / "steady.py"), "16",
    )  # fmt: skip
    wait_for_progress(out / "run" / "progress", 2, 120)
    shown = mldist(["stacks", job], env=slurm_env)
    status = wait_for(slurm_env, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})
    assert shown.returncode == 0, shown.stderr
    for rank in (0, 1):  # the emulated nodes share this host's name
        block = shown.stdout.split(f"rank {rank} (")[1]
        assert re.search(r"#\d+ allreduce\(sum\)", block.splitlines()[0]) and "steady.py:" in block, shown.stdout
    assert " COMPLETED " in f" {status} ", mldist(["logs", job], env=slurm_env).stdout[-3000:]


def test_the_keras_guide_forms_one_group_under_srun_on_two_nodes(
    slurm_env: dict[str, str], tmp_path: Path, sbatch: Sbatch
) -> None:
    """Keras's own DataParallel (tests/workers/keras_guide.py) under a plain `srun -N 2`: 2 processes, 2
    global devices, and both ranks' weights equal one process on the union batch."""
    guide, py = ROOT / "tests" / "workers" / "keras_guide.py", ROOT / ".venv" / "bin" / "python"
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    out, script = tmp_path / "out.txt", tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1 -o {out}\nexport KERAS_BACKEND=jax\n"
        f"srun -N 2 -n 2 {py} {guide} {two}\necho EXIT $?\n"
    )
    # The reference (one process, no launcher) trains while the job does: the test waits for the longer
    # of the two, not for both one after the other.
    alone = subprocess.Popen([str(py), str(guide), str(one)], env={**slurm_env, "KERAS_BACKEND": "jax"})
    try:
        state, text = sbatch(slurm_env, script, out)
        alone_code = alone.wait(timeout=240)
    finally:
        alone.kill()  # nothing once it has ended
    assert state == "COMPLETED" and "EXIT 0" in text, f"{state}\n{text[-3000:]}"
    rows = [json.loads(line.split("RESULT ", 1)[1]) for line in text.splitlines() if "RESULT " in line]
    assert [(r["processes"], r["devices"]) for r in rows] == [(2, 2), (2, 2)], text[-3000:]
    assert alone_code == 0
    w0, w1, ref = (np.load(path) for path in (two / "weights-0.npy", two / "weights-1.npy", one / "weights-0.npy"))
    assert np.array_equal(w0, w1) and np.linalg.norm(w0 - ref) / np.linalg.norm(ref) < 1e-5


def test_the_jax_guide_forms_one_group_under_salloc_mldist_run_and_srun(slurm_env: dict[str, str]) -> None:
    """JAX's own jax.distributed.initialize(), no arguments, no mldist import (tests/workers/jax_guide.py):
    `mldist run` inside `salloc -N 2` (mldist's detector), and a plain `srun -N 2` (JAX's Slurm one)."""
    guide, py = ROOT / "tests" / "workers" / "jax_guide.py", ROOT / ".venv" / "bin" / "python"
    starts = {
        "mldist run": [str(ROOT / ".venv" / "bin" / "mldist"), "run", "-n", "2", "--no-run-dir", "--"],
        "srun": ["srun", "-N", "2", "-n", "2", "--label"],
    }
    for name, start in starts.items():
        argv = ["salloc", "-N", "2", "--ntasks-per-node=1", *start, str(py), str(guide)]
        res = subprocess.run(argv, env=slurm_env, capture_output=True, text=True, timeout=300)
        text = res.stdout + res.stderr[-3000:]
        assert res.returncode == 0, f"{name}: {text}"
        for rank in (0, 1):
            got = {
                line.split(" ", 1)[1].strip()
                for line in res.stdout.splitlines()
                if line.startswith((f"[{rank}]", f"{rank}:"))
            }
            assert {f"{rank} 2 2", "[2.]"} <= got, f"{name}: {text}"


def test_a_job_whose_ranks_never_join_says_so_and_each_rank_has_its_variables(
    slurm_env: dict[str, str], tmp_path: Path, _submit: Submit, wait_for: Submit
) -> None:
    out = tmp_path / "job"
    show = "import os, json; print('VARS', os.environ['KERAS_DISTRIBUTION_PROCESS_ID'], os.environ['TF_CONFIG'])"
    job = _submit(
        slurm_env,
        "--scheduler", "slurm", "--nodes", "2", "--tasks-per-node", "1", "--time", "5", "--tf-config",
        "--venv", str(ROOT / ".venv"), "--output-dir", str(out), "--job-name", "alone", "--", "python", "-c", show,
    )  # fmt: skip
    status = wait_for(slurm_env, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})
    batch = mldist(["logs", job], env=slurm_env).stdout
    assert " COMPLETED " in f" {status} ", batch[-3000:]
    assert "mldist: the 2 workers never formed a group" in batch, batch[-3000:]
    for rank in (0, 1):
        log = mldist(["logs", job, "--rank", str(rank)], env=slurm_env).stdout
        keras_id, tf_config = log.split("VARS ", 1)[1].splitlines()[0].split(" ", 1)
        assert keras_id == str(rank) and json.loads(tf_config)["task"] == {"type": "worker", "index": rank}, log


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


#: The elastic job's epochs (about 1.2 s each on 4 nodes): node4's kill, asked as epoch 3 begins, once landed
#: only as epoch 5 began under the suite's load, leaving the 3-node world no epoch to be frozen in. Two more
#: epochs than the worker's 6 keep both losses inside the job.
ELASTIC_EPOCHS = 8


def test_an_elastic_job_loses_a_killed_and_a_frozen_node_and_completes_without_requeue(
    slurm_env: dict[str, str], tmp_path: Path, _submit: Submit, wait_for: Submit
) -> None:
    """--nodes 4 --min-nodes 2, one job that loses two nodes, one after the other, with no requeue:

    - node4 killed in epoch 3 (``slurm-cluster.sh kill-node 4``: its slurmd and processes die): the job
      re-forms on 3 nodes;
    - node3 frozen in the next epoch of that world (``freeze-node 3``: its slurmd, its job steps and its rank
      stopped with SIGSTOP; no connection closes, nothing answers). The stall watch ends the ranks of node1
      and node2, the agent's probe finds node3 silent within its bound, and the job re-forms on 2 nodes
      and completes.

    (One job for both: each loss its own job paid the job's start and first epochs again.)"""
    out = tmp_path / "job"
    job = _submit(
        slurm_env,
        "--scheduler", "slurm", "--nodes", "4", "--min-nodes", "2", "--tasks-per-node", "1", "--time", "10",
        "--venv", str(ROOT / ".venv"), "--output-dir", str(out), "--job-name", "elastic",
        "--env", "MLDIST_COLLECTIVE_TIMEOUT=10",  # the stall watch ends the ranks that wait for the frozen node
        "--", str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "tests" / "workers" / "elastic_keras.py"), str(out),
        "elastic", str(ELASTIC_EPOCHS),
    )  # fmt: skip
    rank0 = out / "rank-0.log"
    cluster = ["bash", str(ROOT / "scripts" / "slurm-cluster.sh")]
    follow = subprocess.Popen([PY, "-m", "mldist", "logs", "-f", job], env=slurm_env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)  # fmt: skip
    kill: dict[str, float] = {}

    def kill_node4_in_epoch_3() -> None:
        """node4 killed as epoch 3 begins on 4 nodes (here, not after the `mldist status` call in progress:
        the epochs are short, and the next re-form must still have epochs left)."""
        wait_until(lambda: "EPOCH 3 BEGIN 4" in _text(rank0), 240, "epoch 3 on 4 nodes")
        kill["before"] = len(_text(rank0))
        subprocess.run([*cluster, "kill-node", "4"], env=slurm_env, check=True, timeout=60, capture_output=True)
        kill["at"] = time.monotonic()

    killer = threading.Thread(target=kill_node4_in_epoch_3, daemon=True)
    try:
        wait_for(slurm_env, job, {"RUNNING"}, timeout=120)
        killer.start()
        # Queued behind the job while its ranks start (it holds every node from the start).
        _queued_job_shows_its_expected_start(slurm_env, tmp_path, _submit)
        shown = _status_while(slurm_env, job, killer.is_alive, 300)
        assert "at" in kill, f"node4 was not killed\n{_text(rank0)[-3000:]}"
        before = int(kill["before"])
        wait_until(lambda: "FIRST STEP" in _text(rank0)[before:], 120, "the first step after the first re-form")
        print(f"node4 killed to the first step on 3 nodes: {time.monotonic() - kill['at']:.1f} s")
        _set_down(slurm_env, "node4")
        # Frozen as the re-formed world begins its next epoch: it resumes again from that world's commit.
        resumed = _text(rank0).index("FIRST STEP", before)
        wait_until(lambda: re.search(r"EPOCH \d BEGIN 3", _text(rank0)[resumed:]) is not None, 120, "an epoch on 3")
        before = len(_text(rank0))
        subprocess.run([*cluster, "freeze-node", "3"], env=slurm_env, check=True, timeout=60, capture_output=True)
        frozen = time.monotonic()
        wait_until(lambda: "FIRST STEP" in _text(rank0)[before:], 120, "the first step after the second re-form")
        print(f"node3 frozen to the first step on 2 nodes: {time.monotonic() - frozen:.1f} s")
        _set_down(slurm_env, "node3")
        status = wait_for(slurm_env, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=240)
        # Each rank's last line when the job ended: node3's step, killed and revived below, may still add
        # its dying words (Open MPI's banner) to rank-2.log after the job, when `logs -f` has returned.
        lasts = [_text(out / f"rank-{rank}.log").rstrip("\n").rsplit("\n", 1)[-1] for rank in range(4)]
    finally:
        # SIGKILL ends node3's stopped processes where they stand (a thaw first would let its rank write to its
        # log after the job ended); then both nodes back, side by side.
        subprocess.run([*cluster, "kill-node", "3"], env=slurm_env, timeout=60, capture_output=True)
        revive = [subprocess.Popen([*cluster, "revive-node", node], env=slurm_env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL) for node in ("3", "4")]  # fmt: skip
        for proc in revive:
            proc.wait(timeout=120)
        followed = follow.communicate(timeout=60)[0]  # `logs -f` ends with the job
    batch = mldist(["logs", job], env=slurm_env).stdout
    why = f"{status}\n{batch}\n--- rank 0\n{_text(rank0)[-3000:]}"
    assert " COMPLETED " in f" {status} " and " restarts " not in status, why
    assert re.search(r"mldist: lost node node4 \(it does not answer\); re-forming the world on node1,node2,node3: "
                     r"3 worker\(s\) \(--min-nodes 2\)", batch), why  # fmt: skip
    assert re.search(r"mldist: lost node node3 \(it does not answer\); re-forming the world on node1,node2: "
                     r"2 worker\(s\) \(--min-nodes 2\)", batch), why  # fmt: skip
    assert "job step ended with exit code 0" in batch, why
    log0 = _text(rank0)
    assert f"EPOCH {ELASTIC_EPOCHS - 1} BEGIN 2" in log0 and "DONE 0 2" in log0, why  # the 2-node world finished
    assert "DONE 1 2" in _text(out / "rank-1.log"), why
    reforms = json.loads((out / "run" / "elastic.json").read_text())["reforms"]
    assert [(r["lost"], r["before"], r["after"]) for r in reforms] == [(["node4"], 4, 3), (["node3"], 3, 2)], reforms
    # At the end, summary.json as mldist run -H writes it: the same re-form records, how the job ended.
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["elastic"]["reforms"] == reforms and summary["elastic"]["min_nodes"] == 2, summary
    assert (summary["status"], summary["exit_code"], summary["restarts"]) == ("ok", 0, 2), summary
    assert set(reforms[0]) == set(Reform(["n"], "why", 3, 0.0).record()), reforms  # the -H runs' fields

    # `mldist status` while it ran (4 nodes: 3 steps an epoch): the epoch, a rate and a time left that fell;
    # after: the final figures (2 nodes: 6 steps an epoch).
    left = [float(m.group(1)) for line in shown if (m := re.search(r", ([0-9.]+) s left \(written", line))]
    assert len(left) >= 2 and left[-1] < left[0], shown
    progress = rf"RUNNING .* epoch [1-9]/{ELASTIC_EPOCHS} step [0-9]+/3, [0-9,]+ samples/s, loss "
    assert all(re.search(progress, s) for s in shown), shown
    final = mldist(["status", job], env=slurm_env).stdout
    last = f"{ELASTIC_EPOCHS}/{ELASTIC_EPOCHS}"
    done = rf" COMPLETED .* epoch {last} step 6/6, [0-9,]+ samples/s, loss [0-9.e-]+, .* finished"
    assert re.search(done, final), final
    # `mldist logs -f` returned once the job ended, with every rank's last line.
    for rank, last in enumerate(lasts):
        assert f"[{rank}] {last}" in followed, (rank, last, followed[-2000:])
    assert follow.returncode == 0 and "job step ended with exit code 0" in followed, followed[-2000:]


def _set_down(env: dict[str, str], node: str) -> None:
    """``scontrol update State=DOWN`` for a lost node, once the job has re-formed without it.

    What Slurm does itself once the node has not answered for SlurmdTimeout (30 s), here at once: the job
    (``--no-kill``) lets go of the node then, not in COMPLETING after its script ended (a frozen node's
    cleanup waited out SlurmdTimeout, then MessageTimeout: 28 s of the test's 87). The re-forming it
    follows is the agent's own: it probed the nodes itself.
    """
    down = ["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=lost in the elastic test"]
    subprocess.run(down, env=env, check=True, timeout=60, capture_output=True)


def _status_while(env: dict[str, str], job: str, going: Callable[[], bool], timeout: float) -> list[str]:
    """``mldist status JOB`` lines with training progress, asked while ``going()``."""
    deadline, shown = time.monotonic() + timeout, []
    while going():
        assert time.monotonic() < deadline, f"timed out; status so far {shown}"
        line = mldist(["status", job], env=env).stdout.strip()
        if " left (written " in line:
            shown.append(line)
        time.sleep(0.5)  # a Python start per look: leave the cores to the job
    return shown


def _queued_job_shows_its_expected_start(env: dict[str, str], tmp_path: Path, submit: Submit) -> None:
    """A job queued behind the running one (it holds every node): status shows Slurm's start estimate."""
    queued = submit(env, "--nodes", "1", "--time", "5", "--output-dir", str(tmp_path / "queued"), "--", "true")
    try:
        line = ""
        for _ in range(40):
            line = mldist(["status", queued], env=env).stdout
            if "expected to start" in line:
                break
            time.sleep(0.5)
        assert re.search(r" PENDING .*\(expected to start 20[0-9-]+T[0-9:]+\)", line), line
    finally:
        mldist(["cancel", queued], env=env)
