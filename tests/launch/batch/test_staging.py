"""--stage-env: the per-node unpack program and the rank wrapper run for real on a venv, and the refusals.

The Slurm end-to-end run (sbcast, one srun task per node, the ranks from the staged copy) is in
tests/slurm/test_slurm_stage_env.py; the rendered scripts are goldens (tests/golden/stage-*.sh).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest

from harness import JOB_ID, PROG_OF, make_job
from helpers import clean_env, mldist
from mldist.errors import ConfigError
from mldist.launch.batch import listed_once
from mldist.launch.batch.build import build_spec
from mldist.launch.batch.launchers import launcher_name
from mldist.launch.batch.render import render
from mldist.launch.batch.spec import JobSpec
from mldist.launch.batch.staging import STAGED_WRAPPER, UNPACK

SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"


def _env(root: Path) -> Path:
    """A real venv (no pip) with a module, and a script whose #! names the venv's python, as pip writes them."""
    env = root / "env"
    venv.create(env, with_pip=False, symlinks=True)
    (env / SITE / "stagedmark.py").write_text("WHERE = __file__\n")
    finder = env / SITE / "mldist" / "launch" / "batch" / "listed_once.py"  # as an installed mldist has it
    finder.parent.mkdir(parents=True)
    shutil.copy(listed_once.__file__, finder)
    tool = env / "bin" / "whereami"
    tool.write_text(f"#!{env}/bin/python\nimport sys, stagedmark\nprint(sys.prefix, stagedmark.WHERE)\n")
    tool.chmod(0o755)
    return env


def _unpack(stage: Path, archive: Path, env: Path) -> subprocess.CompletedProcess[str]:
    argv = ["bash", "-c", UNPACK, "mldist-unpack", str(stage), str(archive), str(env), "1"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_a_venv_unpacked_on_a_node_runs_from_there_and_never_from_the_original(tmp_path: Path) -> None:
    env = _env(tmp_path)
    archive = tmp_path / "node" / "env.tar"
    archive.parent.mkdir()
    subprocess.run(["tar", "-C", str(env), "-cf", str(archive), "."], check=True, timeout=60)
    stage = tmp_path / "node" / "mldist-env-4242"
    res = _unpack(stage, archive, env)
    assert res.returncode == 0, res.stderr
    assert not archive.exists() and not Path(f"{stage}.part").exists()  # the broadcast copy goes, the dir is whole
    assert (stage / "bin" / "whereami").read_text().startswith(f"#!{stage}/bin/python\n")
    hidden = env.rename(tmp_path / "gone")  # nothing may reach the original any more
    base = clean_env(PYTHONPATH=f"{env}/{SITE}/extra:/opt/other", PATH=f"{env}/bin:/usr/bin:/bin")

    def staged(*cmd: str) -> str:
        argv = ["bash", "-c", STAGED_WRAPPER, "mldist-staged", str(stage), str(env), *cmd]
        out = subprocess.run(argv, capture_output=True, text=True, env=base, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert staged("whereami") == f"{stage} {stage}/{SITE}/stagedmark.py"  # the rewritten #! line
    code = "import os, sys; print(sys.executable, sys.prefix, os.environ['VIRTUAL_ENV'], os.environ['PYTHONPATH'])"
    assert staged("python", "-c", code).split() == [
        f"{stage}/bin/python",
        str(stage),
        str(stage),
        f"{stage}/{SITE}/extra:/opt/other",
    ]
    assert staged("sh", "-c", 'echo "$PATH"').split(":")[:2] == [f"{stage}/bin", "/usr/bin"]
    assert hidden.is_dir()
    # A script's directory (outside the environment) is listed once; its own modules are found.
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "sibling.py").write_text("N = 7\n")
    script = tmp_path / "code" / "train.py"
    script.write_text("import sys, sibling\nprint(sibling.N, type(sys.path_importer_cache[sys.path[0]]).__name__)\n")
    assert staged("python", str(script)) == "7 ListedOnce"
    assert (stage / SITE / "_mldist_listed_once.pth").read_text() == "import _mldist_listed_once\n"


def test_a_stage_dir_that_cannot_be_made_is_one_line_and_exit_2(tmp_path: Path) -> None:
    archive = tmp_path / "env.tar"
    subprocess.run(["tar", "-C", str(tmp_path), "-cf", str(archive), "--files-from", "/dev/null"], check=True)
    blocked = tmp_path / "file"
    blocked.write_text("")
    res = _unpack(blocked / "mldist-env-1", archive, tmp_path / "env")  # under a file: cannot be created
    assert res.returncode == 2
    (line,) = res.stderr.splitlines()
    assert line.startswith("mldist: --stage-env on ") and "give --stage-to a node-local directory" in line, line


def _spec(**kw: Any) -> JobSpec:
    options = {"scheduler": "slurm", "dry_run": False, "stage_env": True, **kw}
    return build_spec(options, ["python", "train.py"], notes=[])


def test_the_environment_staged_is_the_venv_the_conda_env_or_this_mldist_s(tmp_path: Path) -> None:
    env = _env(tmp_path)
    assert _spec(venv=str(env)).stage_path == str(env)
    assert _spec(conda="tf").stage_path is None  # named: the job stages the activated one ($CONDA_PREFIX)
    assert '"$CONDA_PREFIX"' in render(_spec(conda="tf"))
    if sys.prefix != sys.base_prefix:  # the tests run in a venv (scripts/bootstrap.sh's .venv)
        assert _spec().stage_path == sys.prefix


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"venv": "/nowhere/venv"}, "--venv '/nowhere/venv' has no bin/activate"),
        ({"conda": "/nowhere/conda"}, "--stage-env: --conda '/nowhere/conda' is no virtual or conda environment"),
        ({"stage_to": "scratch"}, "--stage-to 'scratch': give tmpdir"),
        ({"stage_to": "/tmp/a b"}, "--stage-to '/tmp/a b': give tmpdir"),
        ({"container": "/sw/tf.sif"}, "--stage-env with --container"),
    ],
)
def test_bad_staging_input_is_refused_in_one_line(options: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        _spec(**options)
    assert str(info.value).startswith(says) and "\n" not in str(info.value)


def test_a_python_that_is_no_environment_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing named, and this mldist runs from a Python that is no venv or conda environment (e.g. /usr)."""
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(ConfigError) as info:
        _spec()
    assert str(info.value) == (
        f"--stage-env: this mldist's Python environment ({tmp_path}) is no virtual or conda environment; "
        "give --venv PATH or --conda NAME"
    )


def test_bad_staging_input_is_one_line_and_exit_2_from_the_cli(tmp_path: Path) -> None:
    res = mldist(["submit", "--scheduler", "cobalt", "--stage-env", "--stage-to", "scratch", "--dry-run", "--",
                  "python", "t.py"], env=clean_env(MLDIST_STATE_DIR=str(tmp_path / "state")), cwd=tmp_path)  # fmt: skip
    assert res.returncode == 2, res.stderr
    (line,) = res.stderr.splitlines()
    assert line.startswith("mldist submit: error: --stage-to 'scratch': give tmpdir"), line


def test_submit_stage_env_dry_run_quotes_every_value(tmp_path: Path) -> None:
    odd = tmp_path / "my env's"
    (odd / "bin").mkdir(parents=True)
    (odd / "bin" / "activate").write_text("")
    res = mldist(["submit", "--scheduler", "pbs", "--venv", str(odd), "--stage-env", "--stage-to", "/local/x",
                  "--dry-run", "--output-dir", str(tmp_path / "out"), "--", "python", "train.py"],
                 env=clean_env(MLDIST_STATE_DIR=str(tmp_path / "state")), cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert f"mldist_stage_src='{tmp_path}/my env'\"'\"'s'" in lines
    assert 'mldist_stage=/local/x/mldist-env-"$job_id"' in lines


def test_mldist_run_stages_only_inside_an_allocation(tmp_path: Path) -> None:
    res = mldist(["run", "-n", "1", "--stage-env", "--", "python", "-c", "1"], env=clean_env(), cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    (line,) = res.stderr.splitlines()
    assert line.startswith("mldist run: error: --stage-env copies the environment to the nodes of a batch allocation")


def test_the_shims_of_an_allocation_start_from_the_staged_python() -> None:
    from mldist.launch.allocated import srun_argv, stage_root, staged_argv

    argv = staged_argv(srun_argv(1, 2, [], ["python", "t.py"]), "/tmp/mldist-env-7-1")
    at = argv.index("/bin/bash")
    assert argv[at : at + 2] == ["/bin/bash", "-c"] and argv[at + 2] == STAGED_WRAPPER
    assert argv[at + 3 : at + 6] == ["mldist-staged", "/tmp/mldist-env-7-1", sys.prefix]
    assert argv[at + 6 :] == [
        "/tmp/mldist-env-7-1" + sys.executable[len(sys.prefix) :], "-m", "mldist.launch.remote_shim", "--", "python",
        "t.py",
    ]  # fmt: skip
    assert (stage_root("tmpdir", {"TMPDIR": "/local"}), stage_root("tmpdir", {}), stage_root("shm", {})) == (
        "/local", "/tmp", "/dev/shm"
    )  # fmt: skip


@pytest.mark.slow  # runs the rendered script under the stand-ins
@pytest.mark.parametrize(
    ("scheduler", "step"), [("pbs", ["-n", "1", "--ppn", "1"]), ("cobalt", ["-n", "1", "-N", "1"])]
)
def test_a_staged_pbs_or_cobalt_script_unpacks_once_per_node_and_runs_the_ranks_there(
    scheduler: str, step: list[str], tmp_path: Path, standin_bin: Path
) -> None:
    env = _env(tmp_path)
    out = tmp_path / "out"
    kw = dict(venv=str(env), stage_env=True, stage_path=str(env), tasks_per_node=2, output_dir=str(out))
    job = make_job(tmp_path, standin_bin, scheduler, cores_per_node=4, **kw)
    assert job.run(timeout=120) == 0, job.explain()
    job_id = JOB_ID[scheduler][1]
    stage = f"{tmp_path}/tmpdir/mldist-env-{job_id}"
    prog = PROG_OF[launcher_name(job.spec)]
    unpacks = [a for a in job.argvs(prog) if "mldist-unpack" in a]
    assert len(unpacks) == 1 and unpacks[0][: len(step)] == step, unpacks
    assert unpacks[0][-4:] == [stage, f"{out}/env-stage.tar", str(env), "0"]  # each node reads the job's archive
    tasks = job.calls("argv-recorder")
    assert len(tasks) == 2
    for task in tasks:
        assert task["env"]["VIRTUAL_ENV"] == stage and task["env"]["PATH"].startswith(f"{stage}/bin:")
    assert f"mldist: staged {env} at {stage} on every node in " in job.stdout
    assert not Path(stage).exists()  # removed after the step


def test_a_site_profile_chooses_where_to_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mldist-sites.toml").write_text('[sites.fast]\nscheduler = "pbs"\nstage_env = true\nstage_to = "shm"\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    env = _env(tmp_path)
    spec = build_spec({"site": "fast", "venv": str(env)}, ["python", "t.py"], notes=[])
    assert (spec.stage_env, spec.stage_to, spec.stage_path) == (True, "shm", str(env))
    assert 'mldist_stage=/dev/shm/mldist-env-"$job_id"' in render(spec).splitlines()
    (tmp_path / "mldist-sites.toml").write_text('[sites.odd]\nscheduler = "pbs"\nstage_path = "/elsewhere"\n')
    with pytest.raises(ConfigError, match="stage_path"):
        build_spec({"site": "odd"}, ["python", "t.py"], notes=[])
