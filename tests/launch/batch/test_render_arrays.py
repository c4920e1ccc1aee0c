"""``--array``: each array task runs the script with its own index and gets its own directory.

The scheduler starts the same ``job.sh`` once per task with the task's index in its variable
(Slurm ``SLURM_ARRAY_TASK_ID``, PBS Pro ``PBS_ARRAY_INDEX``, Torque ``PBS_ARRAYID``); here the
stand-ins run it once per index the same way. Then ``mldist logs`` reads every task's logs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import Job, make_job, out_dir, parsed_directives
from helpers import clean_env, mldist, tail
from mldist.errors import ConfigError
from mldist.launch.batch.spec import JobSpec

#: (scheduler, the variable its array tasks read their index from, the job id mldist records)
ARRAYS = [("slurm", "SLURM_ARRAY_TASK_ID", "4242"), ("pbs", "PBS_ARRAY_INDEX", "77[].pbs")]
ARRAYS += [("pbs", "PBS_ARRAYID", "78[].pbs")]  # Torque's name
WRAP = ("env", "MY_TRIAL=t{array_index}", "MY_DIR={job_dir}", "MY_RANK={rank}")


def run_tasks(tmp: Path, bindir: Path, scheduler: str, var: str, indices: list[str]) -> list[Job]:
    """Run one array job's script once per index, as the scheduler would (2 ranks each)."""
    jobs = []
    for index in indices:
        spec = dict(output_dir=out_dir(tmp), array="3-4", tasks_per_node=2, cpus_per_task=1, wrap=WRAP)
        job = make_job(tmp, bindir, scheduler, job_env={var: index}, **spec)
        assert job.run() == 0, job.explain()
        jobs.append(job)
    return jobs


@pytest.mark.parametrize(("scheduler", "var", "job_id"), ARRAYS, ids=[a[1] for a in ARRAYS])
def test_each_array_task_has_its_own_logs_run_dir_and_index(
    scheduler: str, var: str, job_id: str, tmp_path: Path, standin_bin: Path
) -> None:
    jobs = run_tasks(tmp_path, standin_bin, scheduler, var, ["3", "4"])
    out = Path(out_dir(tmp_path))
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["array-3", "array-4"]
    assert not list(out.glob("rank-*.log")), "no task writes into the shared directory"
    for index in ("3", "4"):
        task_dir = out / f"array-{index}"
        assert sorted(p.name for p in task_dir.glob("rank-*.log")) == ["rank-0.log", "rank-1.log"]
        assert len(list(task_dir.glob("environment-*.txt"))) == 1
        for rank in ("0", "1"):
            lines = (task_dir / f"rank-{rank}.log").read_text().splitlines()
            assert len(lines) == 1, "each task's rank log holds that task's run only"
            seen = json.loads(lines[0])["env"]
            assert seen["MLDIST_ARRAY_INDEX"] == index
            assert seen["MLDIST_JOB_DIR"] == str(task_dir)
            assert seen["MLDIST_RUN_DIR"] == f"{task_dir}/run"
            # --wrap: {array_index} from the scheduler's variable, {job_dir} the task's, {rank} per rank
            assert (seen["MY_TRIAL"], seen["MY_DIR"], seen["MY_RANK"]) == (f"t{index}", str(task_dir), rank)
    assert all(j.leftovers == [] for j in jobs)


@pytest.mark.parametrize(("scheduler", "var", "job_id"), ARRAYS[:2], ids=["slurm", "pbs"])
def test_mldist_logs_shows_every_array_task(
    scheduler: str, var: str, job_id: str, tmp_path: Path, standin_bin: Path
) -> None:
    jobs = run_tasks(tmp_path, standin_bin, scheduler, var, ["3", "4"])
    out = Path(out_dir(tmp_path))
    # The batch log goes where the directive tells the scheduler to put it, with its own placeholders.
    (path,) = [v for d in parsed_directives(jobs[0].text, scheduler) for v in _output(d, scheduler)]
    for index in ("3", "4"):
        named = path.replace("%A", job_id).replace("%a", index).replace("^array_index^", index)
        Path(named).write_text(f"batch of task {index}\n")
    state = tmp_path / "state" / "jobs"
    state.mkdir(parents=True)
    record = {"job_id": job_id, "scheduler": scheduler, "output_dir": str(out), "script": str(out / "job.sh"),
              "submitted_at": 1.0, "command": ["argv-recorder"], "tasks": 2, "array": "3-4"}  # fmt: skip
    name = job_id.replace("[", "_").replace("]", "_")  # as submit names the index entry
    (state / f"{name}.json").write_text(json.dumps(record))
    env = clean_env(MLDIST_STATE_DIR=str(tmp_path / "state"))

    res = mldist(["logs", job_id], env=env, timeout=60)
    assert res.returncode == 0, tail(res)
    prefixes = [line.split("]")[0] + "]" for line in res.stdout.splitlines()]
    assert prefixes == [f"[task {i}{r}]" for i in (3, 4) for r in ("", " rank 0", " rank 1")], res.stdout
    assert "[task 4] batch of task 4" in res.stdout.splitlines()

    one = mldist(["logs", job_id, "--rank", "1"], env=env, timeout=60)
    assert one.returncode == 0, tail(one)
    assert [line.split("]")[0] + "]" for line in one.stdout.splitlines()] == ["[task 3]", "[task 4]"]
    assert all('"MY_RANK": "1"' in line for line in one.stdout.splitlines())


def _output(directive: object, scheduler: str) -> list[str]:
    """The batch log path in one parsed directive, if it is the output one."""
    if scheduler == "slurm":
        assert isinstance(directive, str)
        return [directive.split("=", 1)[1]] if directive.startswith("--output=") else []
    flag, value = directive  # type: ignore[misc]
    return [value] if flag == "-o" else []


def test_array_index_in_wrap_needs_an_array() -> None:
    with pytest.raises(ConfigError, match=r"\{array_index\} needs --array"):
        JobSpec(command=("true",), wrap=("x{array_index}",))


def test_pbs_refuses_requeue_of_one_subjob() -> None:
    from mldist.launch.batch.render import render

    spec = JobSpec(command=("true",), scheduler="pbs", array="0-3", requeue=True, time="1:00:00")
    with pytest.raises(ConfigError, match="--requeue with --array on PBS"):
        render(spec)
