"""Rendered batch scripts run under the stand-ins for a matrix of schedulers and options.

Each case renders one ``JobSpec`` and checks the directives the scheduler would read, then
runs the script and checks what every program was given (harness.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness import (
    BASE,
    JOB_ID,
    LAUNCH_1,
    LAUNCHER,
    PREFIX,
    aprun_env,
    check_consistency,
    check_job_ran,
    cobalt_base,
    fake_venv,
    make_job,
    out_dir,
    parsed_directives,
    pbs_base,
    slurm_base,
)

pytestmark = pytest.mark.slow  # every case runs its script under the stand-ins (some 26 scripts)


@dataclass(frozen=True)
class Case:
    """One scheduler and option set: the spec, and what every program must then have seen."""

    id: str
    scheduler: str
    spec: Callable[[Path], dict[str, Any]]
    directives: Callable[[Path], list[Any]]
    launch: list[str]
    task_env: Callable[[Path], dict[str, str]] = lambda t: {}
    env: dict[str, str] = field(default_factory=dict)
    modules: tuple[str, ...] = ()
    container: Callable[[Path], list[str]] = lambda t: []
    absent: tuple[str, ...] = ()


def _fake_venv(t: Path) -> str:
    return str(fake_venv(t / "venv")) + "/"  # the renderer strips the slash


def _software(scheduler: str) -> Case:
    return Case(
        f"{scheduler}-modules-venv-env",
        scheduler,
        lambda t: dict(
            output_dir=out_dir(t),
            modules=("gcc/12.2", "cuda/12.2"),
            venv=_fake_venv(t),
            env=(("MY_A", "1"), ("MY_B", "two words")),
            unset=("STANDIN_DROP",),
        ),
        lambda t: BASE[scheduler](out_dir(t)),
        LAUNCH_1[scheduler] + (["-e", "MY_A=1", "-e", "MY_B=two words"] if scheduler == "cobalt" else []),  # aprun
        lambda t: {"MY_A": "1", "MY_B": "two words", "STANDIN_VENV_MARKER": "venv-ok"},
        env={"STANDIN_DROP": "set outside"},
        modules=("gcc/12.2", "cuda/12.2"),
        absent=("STANDIN_DROP",),
    )


def _conda(scheduler: str) -> Case:
    return Case(
        f"{scheduler}-conda",
        scheduler,
        lambda t: dict(output_dir=out_dir(t), conda="ml-env"),
        lambda t: BASE[scheduler](out_dir(t)),
        LAUNCH_1[scheduler],
        lambda t: {"STANDIN_CONDA_ENV": "ml-env"},
    )


def _container(scheduler: str) -> Case:
    gpus = 1 if scheduler == "slurm" else 0  # Cobalt refuses GPUs; PBS: the no-GPU form
    launch = LAUNCH_1[scheduler] + (["--gpus-per-task=1"] if gpus else [])
    directives: Callable[[Path], list[Any]] = lambda t: BASE[scheduler](out_dir(t))  # noqa: E731
    if scheduler == "slurm":
        directives = lambda t: [*slurm_base(out_dir(t)), "--gpus-per-node=1"]  # noqa: E731
    elif scheduler == "pbs":
        directives = lambda t: pbs_base(out_dir(t))  # noqa: E731
    return Case(
        f"{scheduler}-container",
        scheduler,
        lambda t: (
            dict(output_dir=out_dir(t), container=str(t / "img.sif"), binds=("/scratch", "/data:/mnt:ro"))
            | ({"gpus_per_node": 1} if gpus else {})
        ),
        directives,
        launch,
        lambda t: {"APPTAINER_CACHEDIR": f"{t}/tmpdir/apptainer-cache-{os.getuid()}"},
        container=lambda t: (
            [
                *["apptainer", "exec", *(["--nv"] if gpus else [])],
                *[
                    "--bind",
                    str(t / "work"),
                    "--bind",
                    out_dir(t),
                    "--bind",
                    "/scratch",
                    "--bind",
                    "/data:/mnt:ro",
                ],
                str(t / "img.sif"),
            ]
        ),
    )


def _requeue(scheduler: str) -> Case:
    extra: dict[str, list[Any]] = {
        "slurm": ["--time=0:10:00", "--requeue", "--signal=B:USR1@30"],
        "pbs": [("-l", "walltime=0:10:00")],
        "cobalt": [("-t", "10")],
    }
    return Case(
        f"{scheduler}-requeue-step-ok",
        scheduler,
        lambda t: dict(output_dir=out_dir(t), requeue=True, time="10", grace=30),
        lambda t: [*BASE[scheduler](out_dir(t)), *extra[scheduler]],
        LAUNCH_1[scheduler],
    )


CASES = [
    Case(
        "slurm-defaults",
        "slurm",
        lambda t: {},
        lambda t: slurm_base("mldist-jobs"),
        LAUNCH_1["slurm"],
        lambda t: (
            {"OMP_NUM_THREADS": "4", "MLDIST_CPUS_PER_TASK": "4", "MLDIST_JOB_DIR": "mldist-jobs"}
            | {"MLDIST_ATTEMPT": "0", "SLURM_JOB_ID": "4242"}
        ),
    ),
    Case(
        "slurm-multinode",
        "slurm",
        lambda t: dict(
            output_dir=out_dir(t),
            job_name="train.v2",
            nodes=2,
            tasks_per_node=2,
            gpus_per_node=2,
            cpus_per_task=3,
            mem="32G",
            time="1:30:00",
            queue="gpu",
            account="proj1",
            array="0-3",
            dependency="afterok:123",
            constraint="a100",
            directives=("--exclusive", "--mail-type=END"),
        ),
        lambda t: [
            *slurm_base(out_dir(t), tasks=2, nodes=2, name="train.v2", exclusive=False, array=True),
            "--cpus-per-task=3",
            "--gpus-per-node=2",
            "--time=1:30:00",
            "--mem=32G",
            "--dependency=afterok:123",
            "--array=0-3",
            "--account=proj1",
            "--partition=gpu",
            "--constraint=a100",
            "--exclusive",
            "--mail-type=END",
        ],
        [
            *["--kill-on-bad-exit=1", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2"],
            *["--cpus-per-task=3", "--cpu-bind=cores", "--gpus-per-task=1"],
        ],
        lambda t: (
            {"OMP_NUM_THREADS": "3", "MLDIST_CPUS_PER_TASK": "3", "MLDIST_JOB_DIR": out_dir(t) + "/array-2"}
            | {"MLDIST_ATTEMPT": "2", "SLURM_NTASKS": "4", "MLDIST_ARRAY_INDEX": "2"}
        ),
        env={"SLURM_RESTART_COUNT": "2", "SLURM_ARRAY_TASK_ID": "2"},
    ),
    Case(
        "slurm-days-gpus-not-per-task",
        "slurm",
        lambda t: dict(output_dir=out_dir(t), tasks_per_node=2, gpus_per_node=4, time="1-12"),
        lambda t: [*slurm_base(out_dir(t), tasks=2), "--gpus-per-node=4", "--time=1-12:00:00"],
        [
            *["--kill-on-bad-exit=1", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2"],
            *["--cpus-per-task=2", "--cpu-bind=cores"],
        ],
    ),
    Case(
        "pbs-defaults",
        "pbs",
        lambda t: {},
        lambda t: pbs_base("mldist-jobs"),
        LAUNCH_1["pbs"],
        lambda t: (
            {"OMP_NUM_THREADS": "4", "MLDIST_CPUS_PER_TASK": "4", "MLDIST_JOB_DIR": "mldist-jobs"}
            | {"MLDIST_ATTEMPT": "0", "PBS_JOBID": "77.pbs"}
        ),
    ),
    Case(
        "pbs-multinode",
        "pbs",
        lambda t: dict(
            output_dir=out_dir(t),
            job_name="pbs-run",
            nodes=2,
            gpus_per_node=2,
            cpus_per_task=4,
            mem="64GB",
            time="2:00:00",
            queue="prod",
            account="proj",
            dependency="afterok:12.pbs",
            array="1-4",
            directives=("-l filesystems=home:eagle",),
        ),
        lambda t: [
            *pbs_base(out_dir(t), "select=2:ncpus=8:mpiprocs=2:ngpus=2:mem=64gb", name="pbs-run", array=True),
            ("-l", "walltime=2:00:00"),
            ("-q", "prod"),
            ("-A", "proj"),
            ("-W", "depend=afterok:12.pbs"),
            ("-J", "1-4"),
            ("-l", "filesystems=home:eagle"),
        ],
        ["-n", "4", "--ppn", "2", "--depth", "4", "--cpu-bind", "depth"],
        lambda t: {"OMP_NUM_THREADS": "4", "MLDIST_CPUS_PER_TASK": "4", "PMI_SIZE": "4"},
    ),
    Case(
        "cobalt-defaults",
        "cobalt",
        lambda t: {},
        lambda t: cobalt_base("mldist-jobs"),
        LAUNCH_1["cobalt"],
        lambda t: (
            {"OMP_NUM_THREADS": "4", "MLDIST_CPUS_PER_TASK": "4", "MLDIST_JOB_DIR": "mldist-jobs"}
            | {"MLDIST_ATTEMPT": "0", "COBALT_JOBID": "88", "MLDIST_SIZE": "1", "MLDIST_LOCAL_SIZE": "1"}
        ),
    ),
    Case(
        "cobalt-multinode",
        "cobalt",
        lambda t: dict(
            output_dir=out_dir(t),
            nodes=2,
            tasks_per_node=2,
            cpus_per_task=4,
            hyperthreads=2,
            time="1:30:30",
            queue="debug-cache-quad",
            account="proj",
            constraint="mcdram=cache:numa=quad",
            dependency="1234:1235",
            directives=("-M me@example.org",),
        ),
        lambda t: [
            *cobalt_base(out_dir(t), nodes=2),
            ("-t", "91"),
            ("-q", "debug-cache-quad"),
            ("-A", "proj"),
            ("--attrs", "mcdram=cache:numa=quad"),
            ("--dependencies", "1234:1235"),
            ("-M", "me@example.org"),
        ],
        ["-n", "4", "-N", "2", "-d", "4", "-j", "2", "-cc", "depth", *aprun_env(4, 2, 4)],
        lambda t: (
            {"OMP_NUM_THREADS": "4", "MLDIST_CPUS_PER_TASK": "4", "MLDIST_SIZE": "4"} | {"MLDIST_LOCAL_SIZE": "2"}
        ),
    ),
    *(make(s) for make in (_software, _conda, _container, _requeue) for s in ("slurm", "pbs", "cobalt")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_script_runs_under_stand_ins(case: Case, tmp_path: Path, standin_bin: Path) -> None:
    job = make_job(tmp_path, standin_bin, case.scheduler, job_env=case.env, **case.spec(tmp_path))
    syntax = subprocess.run(["bash", "-n", str(job.script)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr

    directives = parsed_directives(job.text, case.scheduler)
    assert directives == case.directives(tmp_path)
    all_directives = [line for line in job.text.split("\n") if line.startswith(PREFIX[case.scheduler])]
    assert len(all_directives) == len(case.directives(tmp_path)), "directives after the first command are ignored"
    check_consistency(case.scheduler, directives, case.launch)

    job.run()
    check_job_ran(job, case.launch, case.container(tmp_path))

    for task in job.calls("argv-recorder"):
        for key, value in case.task_env(tmp_path).items():
            assert task["env"].get(key) == value, (key, task["env"])
        for key in case.absent:
            assert key not in task["env"]

    module_calls = job.argvs("module")
    # No 'module purge' unless asked (Cray's aprun and mpi4py need the programming environment).
    loads = [["load", m] for m in case.modules]
    assert module_calls == [*loads, ["list"]]
    launcher = LAUNCHER[case.scheduler]
    ranks = [r for r in job.records() if r["prog"] == launcher and "mldist-rank" in r.get("argv", [])]
    order = [r["prog"] for r in job.records() if r["prog"] == "module" or r in ranks]
    assert order.index(LAUNCHER[case.scheduler]) == len(module_calls), "modules load before the launch"

    if job.spec.conda:
        assert job.argvs("conda") == [["shell.bash", "hook"], ["activate", job.spec.conda]]
    else:
        assert job.calls("conda") == []


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "cobalt"])
def test_environment_record_without_job_id_is_local(scheduler: str, tmp_path: Path, standin_bin: Path) -> None:
    job = make_job(tmp_path, standin_bin, scheduler, output_dir=out_dir(tmp_path))
    del job.env[JOB_ID[scheduler][0]]
    assert job.run() == 0, job.explain()
    assert [p.name for p in job.jobdir.glob("environment-*.txt")] == ["environment-local.txt"]


def test_real_venv_activates_under_set_u(tmp_path: Path, standin_bin: Path) -> None:
    venv = tmp_path / "real venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    job = make_job(tmp_path, standin_bin, output_dir=out_dir(tmp_path), venv=str(venv))
    assert job.run() == 0, job.explain()
    (task,) = job.calls("argv-recorder")
    assert task["env"]["VIRTUAL_ENV"] == str(venv)
    assert task["env"]["PATH"].startswith(f"{venv}/bin:")


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "cobalt"])
def test_user_env_overrides_default_thread_count(scheduler: str, tmp_path: Path, standin_bin: Path) -> None:
    """``--env OMP_NUM_THREADS=7`` reaches the tasks the same way on every scheduler."""
    job = make_job(tmp_path, standin_bin, scheduler, output_dir=out_dir(tmp_path), env=(("OMP_NUM_THREADS", "7"),))
    assert job.run() == 0, job.explain()
    assert [t["env"]["OMP_NUM_THREADS"] for t in job.calls("argv-recorder")] == ["7"]
