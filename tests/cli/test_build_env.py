"""``mldist build-env``: the build job's script for every scheduler, inert hostile paths, one-line refusals.

The fixed build program also runs here for real, with a stand-in ``python3`` that plays
``python3 -m venv`` and the venv's Python (pip, the import check, ``pip freeze``).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, clean_env
from mldist.cli import build_parser, main
from mldist.cli.buildenv import build_plan
from mldist.launch.batch.build import build_spec as submit_spec
from mldist.launch.batch.buildenv import (
    BUILD_SCRIPT,
    BuildRequest,
    build_command,
    constraints_of,
    follow_up,
    install_target,
    running_source,
)
from mldist.launch.batch.render import render

PREFIX = {"slurm": "#SBATCH", "pbs": "#PBS", "cobalt": "#COBALT"}
LAUNCHER = {"slurm": "srun", "pbs": "mpiexec", "cobalt": "aprun"}
HOSTILE = "a b'c\"d$(touch {marker})`touch {marker}`;x"

# Plays python3 (venv creation) and VENV/bin/python (pip, -c, freeze); logs each argv as JSON.
FAKE_PYTHON = """\
import json, os, shutil, sys
from pathlib import Path
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(sys.argv) + "\\n")
args = sys.argv[1:]
if args[:2] == ["-m", "venv"]:
    venv = Path(args[-1])
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "pyvenv.cfg").write_text("home = /fake\\n")
    shutil.copy(sys.argv[0], venv / "bin" / "python")
elif args == ["--version"]:
    print("Python 3.11.0")
elif args[:3] == ["-m", "pip", "freeze"]:
    print("mldist @ file:///src/mldist\\ntensorflow-cpu==2.21.0\\nprivate @ https://me:s3cret@host/p.whl")
"""


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["build-env", *argv])
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _args(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser()[0].parse_args(["build-env", *argv])


def build_spec(args):  # type: ignore[no-untyped-def]
    return build_plan(args).spec


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "cobalt"])
def test_dry_run_prints_the_build_job_for_each_scheduler(
    scheduler: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    venv, out = tmp_path / "venv", tmp_path / "job"
    code, text, err = _cli(capsys, "--venv", str(venv), "--scheduler", scheduler, "--module", "python/3.11",
                           "--output-dir", str(out), "--account", "proj", "--time", "30", "--dry-run")  # fmt: skip
    assert code == 0, err
    assert text.startswith("#!/bin/bash\n") and f"{PREFIX[scheduler]} " in text
    assert "module load python/3.11" in text and f"{LAUNCHER[scheduler]} " in text
    assert shlex.quote(BUILD_SCRIPT) in text and f"mldist-build-env {venv} " in text
    assert not out.exists(), "a dry run writes nothing"
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    spec = build_spec(_args("--venv", str(venv), "--scheduler", scheduler, "--output-dir", str(out)))
    assert (spec.nodes, spec.tasks, spec.total_tasks, spec.time) == (1, 1, 1, "1:00:00")
    source = running_source()  # this checkout, when the tests run from an editable or directory install
    assert spec.command[:2] == ("bash", "-c") and spec.command[4:7] == (str(venv), f"{source}[cpu]", "cpu")
    assert spec.command[8] == (constraints_of(source) or "")


def test_a_site_gives_scheduler_and_directives_but_the_job_stays_one_task(tmp_path: Path) -> None:
    spec = build_spec(_args("--venv", str(tmp_path / "v"), "--site", "polaris", "--gpu", "--output-dir", str(tmp_path)))
    assert (spec.scheduler, spec.nodes, spec.tasks, spec.gpus_per_node) == ("pbs", 1, 1, 1)  # a GPU node
    assert "-l filesystems=home:eagle" in spec.directives and dict(spec.env)["TMPDIR"] == "/tmp"
    assert spec.command[5:7] == (f"{running_source()}[gpu]", "gpu")


def _script_lines(*argv: str) -> list[str]:
    return render(build_spec(_args(*argv))).splitlines()


@pytest.mark.usefixtures("no_site_files")
def test_the_build_job_takes_the_whole_profile_as_submit_does(tmp_path: Path) -> None:
    common = ["--site", "saga", "--output-dir", str(tmp_path / "o")]
    gpu = _script_lines("--venv", str(tmp_path / "v"), *common, "--gpu")
    for line in ("#SBATCH --partition=accel", "#SBATCH --gpus-per-task=1", "#SBATCH --mem-per-cpu=8G",
                 "#SBATCH --ntasks-per-node=1", "module purge", "export OMPI_MCA_pml=ob1"):  # fmt: skip
        assert line in gpu, line
    # The same directives and environment as the training job on one GPU (submit's own code).
    parser = build_parser()[0]
    words = [*common, "--gpus-per-node", "1", "--time", "1:00:00", "--job-name", "mldist-build-env", "--", "true"]
    submitted = render(submit_spec(vars(parser.parse_args(["submit", *words])), ["true"]))
    before_launch = "\n".join(gpu).split("\nsrun ", 1)[0]
    assert before_launch == submitted.split("\nsrun ", 1)[0] and len(before_launch.splitlines()) > 30
    cpu = _script_lines("--venv", str(tmp_path / "v"), *common)
    assert "#SBATCH --partition=normal" in cpu and not any("gpus" in line for line in cpu)


@pytest.mark.usefixtures("no_site_files")
def test_the_build_job_takes_submit_s_options(tmp_path: Path) -> None:
    lines = _script_lines("--venv", str(tmp_path / "v"), "--site", "saga", "--gpu", "--output-dir", str(tmp_path),
                          "--constraint", "a100", "--directive=--reservation=build", "--gpus-per-node", "2",
                          "--gpu-request", "total", "--no-module-purge", "--module", "python/3.11",
                          "--env", "PIP_CACHE_DIR=$SCRATCH/pip", "--account", "nn1234k")  # fmt: skip
    for line in ("#SBATCH --constraint=a100", "#SBATCH --reservation=build", "#SBATCH --gpus=2",
                 "#SBATCH --account=nn1234k", "#SBATCH --partition=accel", "module load python/3.11",
                 'export PIP_CACHE_DIR="${SCRATCH-}"/pip'):  # fmt: skip
        assert line in lines, line
    assert "module purge" not in lines
    assert "--no-module-purge" in follow_up("/v", ["python/3.11"], "saga", None, False)


@pytest.mark.usefixtures("no_site_files")
@pytest.mark.parametrize(("gpu", "extra"), [((), "jax"), (("--gpu",), "jax-cuda")])
def test_backend_jax_installs_the_jax_extra_and_checks_jax_imports(
    tmp_path: Path, gpu: tuple[str, ...], extra: str
) -> None:
    script = "\n".join(_script_lines("--venv", str(tmp_path / "v"), "--backend", "jax", *gpu, "--scheduler", "slurm"))
    assert f"[{extra}]' {extra} " in script
    assert 'jax*) check="$check, jax"' in script
    assert "[cpu]" not in script and "[gpu]" not in script


def test_submit_backend_jax_sets_keras_backend_in_every_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["submit", "--scheduler", "slurm", "--dry-run", "--backend", "jax", "--launcher", "openmpi", "--", "t"]
    args = build_parser()[0].parse_args(argv)
    script = render(submit_spec(vars(args), ["python", "t.py"]))
    assert "export KERAS_BACKEND=jax" in script.splitlines()
    assert "KERAS_BACKEND; do" in script  # Open MPI's -x list forwards it to remote ranks


@pytest.mark.usefixtures("no_site_files")
def test_the_build_job_keeps_the_proxies_and_activates_nothing(tmp_path: Path) -> None:
    (tmp_path / "mldist-sites.toml").write_text(
        '[sites.mine]\nextends = "apptainer-slurm"\nvenv = "/nonexistent/tf"\nnodes = 4\ntasks_per_node = 4\n'
        'wrap = ["nsys", "profile", "--"]\nrequeue = true\ncontainer = "/images/tf.sif"\nmodules = ["python/3.11"]\n'
    )
    spec = build_spec(_args("--venv", str(tmp_path / "v"), "--site", "mine", "--output-dir", str(tmp_path / "o")))
    assert (spec.nodes, spec.tasks, spec.venv, spec.container, spec.wrap, spec.requeue) == (1, 1, None, None, (), False)
    assert spec.unset == () and spec.modules == ("python/3.11",)
    text = render(spec)
    # No proxy unset (the build needs them); the engine decision's own fallback may unset MLDIST_DECISION.
    unsets = [line for line in text.splitlines() if line.lstrip().startswith("unset ")]
    assert unsets in ([], ["  unset MLDIST_DECISION"]), unsets
    assert "/nonexistent/tf" not in text and "apptainer" not in text


class _Dist:
    def __init__(self, direct_url: str | None) -> None:
        self.direct_url = direct_url

    def read_text(self, name: str) -> str | None:
        return self.direct_url if name == "direct_url.json" else None


def test_the_running_mldist_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mldist
    from mldist.launch.batch import buildenv

    tree, site = tmp_path / "my tree", tmp_path / "lib" / "site-packages"
    (tree / "src" / "mldist").mkdir(parents=True)
    (tree / "pyproject.toml").write_text('[project]\nname = "mldist"\n')
    url = json.dumps({"url": (tree.as_uri()), "dir_info": {"editable": True}})
    monkeypatch.setattr(buildenv.metadata, "distribution", lambda name: _Dist(url))
    assert running_source(site / "mldist") == str(tree)  # pip's direct_url.json first
    monkeypatch.setattr(buildenv.metadata, "distribution", lambda name: _Dist(None))
    assert running_source(tree / "src" / "mldist") == str(tree)  # a pyproject.toml two levels up
    assert running_source(site / "mldist") == f"mldist=={mldist.__version__}"  # an index install
    wheel = json.dumps({"url": "https://example.org/mldist-0.1.0-py3-none-any.whl", "archive_info": {}})
    monkeypatch.setattr(buildenv.metadata, "distribution", lambda name: _Dist(wheel))
    assert running_source(site / "mldist") == f"mldist=={mldist.__version__}"


def test_install_target_and_constraints() -> None:
    assert install_target("mldist==0.1.0", "cpu") == "mldist[cpu]==0.1.0"
    assert install_target("mldist[gpu]==0.1.0", "cpu") == "mldist[gpu]==0.1.0"
    assert install_target("/w/mldist-0.1.0-py3-none-any.whl", "gpu") == "/w/mldist-0.1.0-py3-none-any.whl[gpu]"
    assert constraints_of("mldist==0.1.0") is None and constraints_of(str(ROOT)) == str(ROOT / "constraints.txt")


def test_source_option_names_a_requirement_or_a_path(tmp_path: Path) -> None:
    spec = build_spec(_args("--venv", str(tmp_path / "v"), "--scheduler", "slurm", "--source", "mldist==0.1.0",
                            "--output-dir", str(tmp_path / "o")))  # fmt: skip
    assert spec.command[5:] == ("mldist[cpu]==0.1.0", "cpu", "", "", "")
    wheel = tmp_path / "mldist-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    spec = build_spec(_args("--venv", str(tmp_path / "v"), "--scheduler", "slurm", "--source", str(wheel),
                            "--output-dir", str(tmp_path / "o")))  # fmt: skip
    assert spec.command[5] == f"{wheel}[cpu]" and spec.command[8] == ""


def test_an_existing_venv_or_empty_directory_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "empty").mkdir()
    for venv in ("venv", "empty"):
        code, _, err = _cli(capsys, "--venv", str(tmp_path / venv), "--scheduler", "slurm", "--dry-run")
        assert code == 0, err


BAD = [
    (["--backend", "torch"], "invalid choice: 'torch'"),
    (["--venv", "{tmp}/a-file"], "exists and is not a directory"),
    (["--venv", "{tmp}/full"], "non-empty directory but not a venv"),
    (["--module", "python/3.11\nmodule load evil"], "is not a module name"),
    (["--module", "two words"], "is not a module name"),
    (["--venv", "{tmp}/v\nx"], "control character"),
    (["--source", "./no/such/tree"], "does not exist"),
    (["--source", "mldist\n==1"], "control character"),
    (["--time", "1:99:00"], "go up to 59"),
    (["--job-name", "x\n"], "--job-name"),
    (["--site", "nowhere"], "is not defined"),
    (["--wheelhouse", "{tmp}/a-file"], "is not a directory"),
    (["--wheelhouse", "{tmp}/w", "--python-version", "3.x"], "is not a Python version"),
    (["--wheelhouse", "{tmp}/w", "--platform", "many linux"], "is not a wheel platform tag"),
    (["--platform", "manylinux2014_x86_64"], "give --wheelhouse DIR too"),
    (["--wheelhouse", "{tmp}/w", "--source", "git+https://example.org/m.git"], "with --wheelhouse"),
    (["--wheelhouse", "{tmp}/w", "--source", "{tmp}/full"], "no pyproject.toml naming mldist"),
    (["--constraint", "gpu\n"], "--constraint"),
    (["--gpus-per-node", "-1"], "not a whole number"),
    (["--directive=--reservation=a\nb"], "one line each"),
    (["--env", "K\n=v"], "not a variable name"),
    (["--module-purge", "--nodes", "2"], "unrecognized arguments: --nodes 2"),
]


@pytest.fixture
def no_site_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the built-in profiles and ./mldist-sites.toml of tmp_path (the working directory)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize(("argv", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("x")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    base = ["--venv", str(tmp_path / "venv"), "--scheduler", "slurm", "--dry-run"]
    code, out, err = _cli(capsys, *base, *argv)
    assert (code, out) == (2, ""), err
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err, err


def test_help_shows_an_example() -> None:
    res = subprocess.run([sys.executable, "-m", "mldist", "build-env", "--help"], capture_output=True, text=True,
                         env=clean_env(), timeout=60)  # fmt: skip
    assert res.returncode == 0 and "example:\n  mldist build-env --venv" in res.stdout


def _fake_bin(tmp_path: Path) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir(parents=True)
    fake = bindir / "python3"
    fake.write_text(f"#!{sys.executable}\n{FAKE_PYTHON}")
    fake.chmod(0o755)
    return bindir


def _run_build(tmp_path: Path, req: BuildRequest) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    """Run the job's task as the launcher would, in ``tmp_path`` (job directory ``tmp_path/job``)."""
    log, jobdir = tmp_path / "calls.jsonl", tmp_path / "job"
    jobdir.mkdir(parents=True)
    env = clean_env(FAKE_LOG=str(log), MLDIST_JOB_DIR=str(jobdir))
    env["PATH"] = f"{_fake_bin(tmp_path)}:{os.environ['PATH']}"
    res = subprocess.run(list(build_command(req)), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return res, calls


def test_the_build_program_runs_with_a_hostile_venv_path_inert(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    venv = tmp_path / "venvs" / HOSTILE.format(marker=marker)
    req = BuildRequest(str(venv), "/src/mldist", requirements="/r e q.txt", constraints="/src/mldist/constraints.txt")
    res, calls = _run_build(tmp_path, req)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not marker.exists(), "text of the venv path ran as shell code"
    py = str(venv / "bin" / "python")
    assert [c[1:] for c in calls if c[0] != py][-1] == ["-m", "venv", "--", str(venv)]
    venv_calls = [c[1:] for c in calls if c[0] == py]
    assert venv_calls[0] == ["-m", "pip", "install", "--upgrade", "pip"]
    assert venv_calls[1] == ["-m", "pip", "install", "/src/mldist[cpu]", "-r", "/r e q.txt", "-c",
                             "/src/mldist/constraints.txt"]  # fmt: skip
    assert venv_calls[2][0] == "-c" and venv_calls[2][1].startswith("import mldist, tensorflow, mpi4py;")
    for record in (venv / "mldist-build.txt", tmp_path / "job" / "mldist-build.txt"):
        text = record.read_text()
        assert text.startswith("# mldist build-env: ") and "tensorflow-cpu==2.21.0" in text
        assert "s3cret" not in text and "https://<redacted>@host/p.whl" in text


def test_the_build_program_updates_a_venv_and_refuses_other_directories(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /fake\n")
    (venv / "bin" / "python").write_text(f"#!{sys.executable}\n{FAKE_PYTHON}")
    (venv / "bin" / "python").chmod(0o755)
    res, calls = _run_build(tmp_path, BuildRequest(str(venv), "mldist==0.1.0", gpu=True))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "updating the existing venv" in res.stdout and not any(c[1:3] == ["-m", "venv"] for c in calls)
    assert ["-m", "pip", "install", "mldist[gpu]==0.1.0"] in [c[1:] for c in calls]
    assert any(c[1] == "-c" and c[2].startswith("import mldist, tensorflow;") for c in calls)
    other = tmp_path / "other"
    (other / "data").mkdir(parents=True)  # filled after mldist checked it: the job looks again
    res, calls = _run_build(tmp_path / "second", BuildRequest(str(other), "mldist"))
    assert res.returncode == 2 and "is not an empty directory or a venv" in res.stdout
    assert not [c for c in calls if c[1:] != ["--version"]], calls


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "cobalt"])
def test_the_script_passes_a_hostile_venv_path_as_one_word(scheduler: str, tmp_path: Path) -> None:
    venv = tmp_path / HOSTILE.format(marker=tmp_path / "pwned")
    spec = build_spec(_args("--venv", str(venv), "--scheduler", scheduler, "--output-dir", str(tmp_path / "o")))
    assert spec.command[4] == str(venv)
    words = shlex.split(render(spec).split(" mldist-rank ", 1)[1].split(" &\nchild=$!", 1)[0])
    assert tuple(words[-len(spec.command) :]) == spec.command  # the task's argv, word for word


def test_a_missing_requirements_file_is_a_warning_in_a_dry_run_and_an_error_otherwise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--venv", str(tmp_path / "venv"), "--scheduler", "slurm", "--requirements", str(tmp_path / "no.txt")]
    code, out, err = _cli(capsys, *base, "--dry-run")
    assert code == 0 and "#SBATCH" in out and "warning: --requirements" in err and "a dry run goes on" in err
    code, out, err = _cli(capsys, *base)
    assert (code, out) == (2, "") and err.strip().endswith("is not a file")
