"""Hostile input: values that would break a script if any reached a shell or a directive unquoted.

Every value must arrive verbatim where it was meant to go (task argv, environment, module
names, venv/conda/container paths, binds) and never run as shell code or add a directive.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness import (
    BASE,
    CMD,
    LAUNCH_1,
    aprun_env,
    check_job_ran,
    cobalt_base,
    fake_venv,
    header,
    make_job,
    out_dir,
    parsed_directives,
    pbs_base,
    slurm_base,
)
from mldist.launch.batch.render import render
from mldist.launch.batch.spec import JobSpec

# Tests that run a script are marked slow; those that only render are not.


def hostile(canary: str) -> list[str]:
    """Strings that break a script if any of them reaches the shell unquoted (each may touch ``canary``)."""
    return [
        "it's",
        'say "hi"',
        "two  words ",
        f"$(touch {canary})",
        f"`touch {canary}`",
        f"a; touch {canary}",
        f"x && touch {canary}",
        f"y || touch {canary}",
        f"z | touch {canary}",
        f"line1\ntouch {canary}\n",
        f"x\n#SBATCH --wrap='touch {canary}'\n#PBS -l x=1\n#COBALT -n 9",
        f">{canary}",
        "*",
        "~",
        "~/x",
        "-n",
        "--help",
        "$HOME",
        "${PATH}",
        "\\",
        f"\\$(touch {canary})",
        "'\"'\"'",
        "",
        " ",
        "tab\there",
        "!bang",
        "#hash",
        "{a,b}",
        "%j",
        "h\u00e9llo \u2713",
        "$'\\x41'",
        "&",
    ]


@pytest.mark.slow  # runs the script under the stand-ins
@pytest.mark.parametrize("variant", ["venv-container", "conda"])
@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "cobalt"])
def test_hostile_values_arrive_verbatim(scheduler: str, variant: str, tmp_path: Path, standin_bin: Path) -> None:
    canary = tmp_path / "CANARY"
    h = hostile(str(canary))
    # In --env values only $NAME/${NAME} expand: a hostile value arrives verbatim with its $ written $$
    # (backticks are refused outright; see test_env_values_with_shell_syntax_are_refused).
    literal = [v for v in h if "`" not in v]
    env = tuple((f"MY_H{i}", v.replace("$", "$$")) for i, v in enumerate(literal))
    modules = tuple(h[i] for i in (0, 1, 2, 3, 4, 5, 9, 10, 12, 15))  # a sample: each load is a process
    nasty = f"a 'b\"c $(touch {canary}) `touch {canary}`; && * ~ \n x"
    kw: dict[str, Any] = dict(
        command=("argv-recorder", *h), tasks_per_node=2, output_dir=out_dir(tmp_path), env=env, modules=modules
    )
    container: list[str] = []
    if variant == "conda":
        kw["conda"] = f"env {nasty}"
    else:
        venv = fake_venv(tmp_path / f"venv {nasty}")
        image = str(tmp_path / f"img {nasty}.sif")
        binds = (f"/data/it's {nasty}", f"/x/$(touch {canary})", f"/y/`touch {canary}`;&&*", "/z\nw")
        kw.update(venv=str(venv), container=image, binds=binds)
        container = ["apptainer", "exec", "--bind", str(tmp_path / "work"), "--bind", out_dir(tmp_path)]
        container += [a for b in binds for a in ("--bind", b)] + [image]

    job = make_job(tmp_path, standin_bin, scheduler, **kw)
    assert subprocess.run(["bash", "-n", str(job.script)]).returncode == 0
    expected = {
        "slurm": slurm_base(out_dir(tmp_path), tasks=2),
        "pbs": pbs_base(out_dir(tmp_path), "select=1:mpiprocs=2"),
        "cobalt": cobalt_base(out_dir(tmp_path)),
    }[scheduler]
    assert parsed_directives(job.text, scheduler) == expected
    job.run()
    assert not canary.exists(), "a value was run as shell code"
    tasks_per_node = 2
    launch = {
        "slurm": [
            *["--kill-on-bad-exit=1", "--nodes=1", "--ntasks=2", f"--ntasks-per-node={tasks_per_node}"],
            *["--cpus-per-task=2", "--cpu-bind=cores"],
        ],
        "pbs": ["-n", "2", "--ppn", "2", "--depth", "2", "--cpu-bind", "depth"],
        "cobalt": [
            *["-n", "2", "-N", "2", "-d", "2", "-j", "1", "-cc", "depth", *aprun_env(2, 2, 2)],
            *(word for i, v in enumerate(literal) for word in ("-e", f"MY_H{i}={v}")),  # aprun -e: verbatim too
        ],
    }[scheduler]
    check_job_ran(job, launch, container, command=("argv-recorder", *h))

    for task in job.calls("argv-recorder"):
        assert task["argv"] == h
        arrived = {k: v for k, v in task["env"].items() if k.startswith("MY_H")}
        assert arrived == {k: v for (k, _), v in zip(env, literal, strict=True)}
        if variant == "conda":
            assert task["env"]["STANDIN_CONDA_ENV"] == kw["conda"]
        else:
            assert task["env"]["STANDIN_VENV_MARKER"] == "venv-ok"
    assert job.argvs("module") == [*(["load", m] for m in modules), ["list"]]
    if variant == "conda":
        assert job.argvs("conda") == [["shell.bash", "hook"], ["activate", kw["conda"]]]


def test_hostile_values_do_not_add_directives(tmp_path: Path) -> None:
    """Values in the body may hold directive-looking lines; schedulers stop reading at the first command."""
    h = tuple(hostile(str(tmp_path / "CANARY")))
    for scheduler in ("slurm", "pbs", "cobalt"):
        plain = render(JobSpec(command=CMD, scheduler=scheduler, output_dir="/o"))
        lookalike = next(v for v in h if "#SBATCH" in v)
        nasty = render(JobSpec(command=h, scheduler=scheduler, output_dir="/o", env=(("MY_X", lookalike),)))
        assert header(nasty) == header(plain)
        assert parsed_directives(nasty, scheduler) == BASE[scheduler]("/o")


SLURM_ODD_DIRS = ["out dir", "it's", "a#b", "x 'y' #z", "tab\there"]


@pytest.mark.parametrize("name", SLURM_ODD_DIRS, ids=["space", "quote", "hash", "mixed", "tab"])
def test_slurm_output_directive_reads_back_as_the_output_dir(name: str, tmp_path: Path) -> None:
    """sbatch reads ``--output`` with its own quoting rules; what it reads must be the job's directory."""
    out = str(tmp_path / name)
    text = render(JobSpec(command=CMD, output_dir=out))
    words = parsed_directives(text, "slurm")  # raises like sbatch on an unmatched quote
    assert f"--output={out}/job-%j.out" in words


@pytest.mark.slow  # runs the script under the stand-ins
def test_slurm_output_dir_with_space_and_shell_syntax_runs(tmp_path: Path, standin_bin: Path) -> None:
    canary = tmp_path / "CANARY"
    out = str(tmp_path / f"out dir $(touch {canary}) `touch {canary}`;&&*~")
    job = make_job(tmp_path, standin_bin, output_dir=out)
    assert f'#SBATCH --output="{out}/job-%j.out"' in header(job.text)
    assert parsed_directives(job.text, "slurm") == slurm_base(out)
    job.run()
    check_job_ran(job, LAUNCH_1["slurm"], [])
    assert (Path(out) / "rank-0.log").exists()
    assert job.calls("argv-recorder")[0]["env"]["MLDIST_JOB_DIR"] == out
    assert not canary.exists()


@pytest.mark.slow  # runs the script under the stand-ins
def test_leading_dash_venv_path_is_sourced(tmp_path: Path, standin_bin: Path) -> None:
    """A relative venv whose name starts with '-' must not be read as an option of ``source``."""
    fake_venv(tmp_path / "work" / "-venv")
    job = make_job(tmp_path, standin_bin, output_dir=out_dir(tmp_path), venv="-venv")
    assert job.run() == 0, job.explain()
    assert job.calls("argv-recorder")[0]["env"].get("STANDIN_VENV_MARKER") == "venv-ok", job.stderr


@pytest.mark.slow  # runs the script under the stand-ins
def test_leading_dash_container_path_is_the_image(tmp_path: Path, standin_bin: Path) -> None:
    """A relative image whose name starts with '-' must reach apptainer as the image, not as an option."""
    job = make_job(tmp_path, standin_bin, output_dir=out_dir(tmp_path), container="-image.sif")
    assert job.run() == 0, job.explain()
    assert len(job.calls("argv-recorder")) == 1
