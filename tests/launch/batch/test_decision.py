"""The engine decision reaches the ranks of ``mldist submit``'s job scripts, as it reaches ``mldist run``'s.

The script decides once, on the job's first node, before its launch line (``python3 -m
mldist.launch.batch.decided``), and exports the decision as ``MLDIST_DECISION``; every rank takes
it where its facts are the script's, and ``mldist env`` in the rank says so. Run for real here
under the stand-in launchers (srun, mpiexec, aprun), each rank a real ``mldist env``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness import PROG_OF, make_job, out_dir
from helpers import PY, clean_env, mldist, tail
from mldist.placement import handed

#: Each scheduler's launch line, and what its script's ``decided`` call names as the launcher.
SCHEDULERS = {"slurm": "srun", "pbs": "pals", "cobalt": "aprun"}
#: What a real srun step gives its ranks besides the stand-in's rank variables (mldist tells a step by it).
STEP = {
    "slurm": {"SLURM_STEP_ID": "0", "SLURM_NODEID": "0", "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "2"}
}
#: A rank's ``mldist env`` without TensorFlow: its "decided" line says who decided.
RANK_ENV = (PY, "-m", "mldist", "env", "--no-tensorflow")


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_a_dry_run_script_decides_once_before_its_launch_line(scheduler: str, tmp_path: Path) -> None:
    argv = ["submit", "--scheduler", scheduler, "--dry-run", "--nodes", "2", "--tasks-per-node", "3"]
    env = clean_env(XDG_CONFIG_HOME=str(tmp_path / "config"), HOME=str(tmp_path))
    res = mldist([*argv, "--time", "1:00:00", "--", "python", "train.py"], timeout=60, cwd=tmp_path, env=env)
    assert res.returncode == 0, tail(res)
    lines = res.stdout.splitlines()
    decide = [i for i, line in enumerate(lines) if "-m mldist.launch.batch.decided " in line]
    launch = [i for i, line in enumerate(lines) if line.rstrip().endswith("python train.py &")]
    assert len(decide) == 1 and len(launch) == 1 and decide[0] < launch[0], res.stdout
    assert f"python3 -m mldist.launch.batch.decided 6 {SCHEDULERS[scheduler]} 2>/dev/null" in lines[decide[0]]
    assert lines[decide[0] + 1].strip() == 'export MLDIST_DECISION="$mldist_decision"'
    assert lines[decide[0] + 3].strip() == "unset MLDIST_DECISION"  # never a stale one from the submitting shell


def _rank_lines(job_dir: Path, ranks: int, start: str) -> list[str]:
    logs = [(job_dir / f"rank-{r}.log").read_text() for r in range(ranks)]
    return [line for text in logs for line in text.splitlines() if line.startswith(start)]


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_every_rank_of_a_job_takes_the_decision_its_script_handed(
    scheduler: str, tmp_path: Path, standin_bin: Path
) -> None:
    spec = dict(nodes=1, tasks_per_node=2, output_dir=out_dir(tmp_path), env=(("MLDIST_COMMUNICATION", "ring"),))
    job = make_job(tmp_path, standin_bin, scheduler, job_env=STEP.get(scheduler), command=RANK_ENV, **spec)
    assert job.run(timeout=120) == 0, job.explain()
    assert _rank_lines(job.jobdir, 2, "decided ") == ["decided   decided by mldist submit: asked for 'ring'"] * 2
    launch = job.calls(PROG_OF[SCHEDULERS[scheduler]])[-1]  # the launch line's: what the launcher passes on
    given = handed.decode(launch["env"]["MLDIST_DECISION"])
    assert (given.decision.name, given.asked, given.by) == ("ring", "ring", handed.SUBMIT)


def test_a_rank_whose_facts_differ_decides_alone_and_says_so(tmp_path: Path, standin_bin: Path) -> None:
    """The script decided MPI for 2 ranks; under the stand-in srun each rank's MPI world is its own (1 rank)."""
    spec = dict(nodes=1, tasks_per_node=2, output_dir=out_dir(tmp_path))
    job = make_job(tmp_path, standin_bin, job_env=STEP["slurm"], command=RANK_ENV, **spec)
    assert job.run(timeout=180) == 0, job.explain()
    lines = _rank_lines(job.jobdir, 2, "decided ")
    assert len(lines) == 2 and all("(its facts differ from those of mldist submit)" in line for line in lines), lines
    assert all(line.startswith("decided   decided here: ") for line in lines), lines


def test_a_job_whose_python_cannot_decide_leaves_each_rank_to_decide_alone(tmp_path: Path, standin_bin: Path) -> None:
    spec = dict(nodes=1, tasks_per_node=2, output_dir=out_dir(tmp_path), env=(("MLDIST_COMMUNICATION", "ring"),))
    job = make_job(tmp_path, standin_bin, command=RANK_ENV, job_env={"STANDIN_NO_MLDIST": "1", **STEP["slurm"]}, **spec)
    assert job.run(timeout=120) == 0, job.explain()
    said = "mldist: no engine decision to hand the ranks (python3 has no mldist here); each decides for itself"
    assert said in job.stdout.splitlines(), job.explain()
    assert (
        _rank_lines(job.jobdir, 2, "decided ") == ["decided   decided here: asked for 'ring' (no mldist launcher)"] * 2
    )


def test_a_bad_setting_is_said_once_by_the_script(tmp_path: Path, standin_bin: Path) -> None:
    spec = dict(nodes=1, tasks_per_node=1, output_dir=out_dir(tmp_path), env=(("MLDIST_COMMUNICATION", "tcp"),))
    job = make_job(tmp_path, standin_bin, command=("true",), **spec)
    job.run(timeout=120)
    said = "mldist: no engine decision to hand the ranks (communication='tcp' is not one of auto, mpi, ring, nccl); "
    assert said + "each decides for itself" in job.stdout.splitlines(), job.explain()


def test_the_decision_module_refuses_a_bad_count_in_one_line() -> None:
    res = subprocess.run([PY, "-m", "mldist.launch.batch.decided", "0", "srun"], capture_output=True, text=True)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip() == "usage: python -m mldist.launch.batch.decided RANKS LAUNCHER"
