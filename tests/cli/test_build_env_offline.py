"""``mldist build-env --wheelhouse``: wheels fetched on the login node, an install that never asks an index.

The real test builds throwaway ``mldist`` and ``tensorflow`` projects into wheels, lets
``build-env`` fill a wheelhouse from them (pip pointed at a local folder instead of the
index), then runs the job's own build program with the real ``python3 -m venv`` and pip in a
network namespace without any network (``unshare -rn``; where that is not allowed, with dead
proxies), so any index access would fail the install.
"""

from __future__ import annotations

import ensurepip
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from helpers import clean_env
from mldist.cli import build_parser, main
from mldist.cli.buildenv import build_plan
from mldist.launch.batch.buildenv import BUILD_SCRIPT

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"
[project]
name = "{name}"
version = "{version}"
[project.optional-dependencies]
gpu = [{deps}]
[tool.setuptools]
packages = ["{name}"]
"""


def _project(root: Path, name: str, version: str, deps: str = "") -> Path:
    tree = root / name
    (tree / name).mkdir(parents=True)
    (tree / name / "__init__.py").write_text(f'__version__ = "{version}"\n')
    (tree / "pyproject.toml").write_text(PYPROJECT.format(name=name, version=version, deps=deps))
    return tree


def _offline_env() -> dict[str, str]:
    """pip as on a node without internet: dead proxies, no user config, no PYTHONPATH (the real mldist)."""
    dead = "http://127.0.0.1:9"
    env = {k: v for k, v in clean_env().items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    return env | {"http_proxy": dead, "https_proxy": dead, "HTTP_PROXY": dead, "HTTPS_PROXY": dead,
                  "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1"}  # fmt: skip


def _no_network() -> list[str]:
    """``unshare -rn`` (a user and network namespace: loopback only, down) where it is allowed."""
    ok = shutil.which("unshare") and subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0
    return ["unshare", "-rn"] if ok else []


def test_a_dry_run_with_a_wheelhouse_installs_with_no_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    house, out = tmp_path / "wheel house", tmp_path / "job"
    argv = ["build-env", "--venv", str(tmp_path / "v"), "--scheduler", "pbs", "--wheelhouse", str(house), "--source",
            "mldist==0.1.0", "--module", "cray-python/3.10.13", "--output-dir", str(out), "--dry-run"]  # fmt: skip
    assert main(argv) == 0
    text, err = capsys.readouterr()
    assert not house.exists() and not out.exists(), "a dry run fills and writes nothing"
    assert shlex.quote(BUILD_SCRIPT) in text and 'offline=(--no-index --find-links "$wheelhouse")' in BUILD_SCRIPT
    assert 'args=(install ${offline[@]+"${offline[@]}"} "$target")' in BUILD_SCRIPT
    assert '"$py" -m pip install ${offline[@]+"${offline[@]}"} --upgrade pip' in BUILD_SCRIPT
    task = shlex.split(text.split(" mldist-rank ", 1)[1].split(" &\nchild=$!", 1)[0])[-10:]
    assert task[3:] == ["mldist-build-env", str(tmp_path / "v"), "mldist[cpu]==0.1.0", "cpu", "", "", str(house)]
    # The nodes' Python comes from the module; the download is shown, not run.
    want = f"pip download --only-binary=:all: --dest {shlex.quote(str(house))} --find-links {shlex.quote(str(house))}"
    assert len(err.splitlines()) == 1 and f"{want} --python-version 3.10 pip 'mldist[cpu]==0.1.0'" in err, err


def test_python_version_and_platform_given_win_over_the_module(tmp_path: Path) -> None:
    args = build_parser()[0].parse_args(["build-env", "--venv", str(tmp_path / "v"), "--scheduler", "slurm",
        "--module", "python/3.10", "--wheelhouse", str(tmp_path / "w"), "--python-version", "3.12",
        "--platform", "manylinux2014_aarch64", "--platform", "manylinux_2_28_aarch64", "--gpu"])  # fmt: skip
    house = build_plan(args).wheelhouse
    assert house and (house.python_version, house.platforms) == (
        "3.12",
        ("manylinux2014_aarch64", "manylinux_2_28_aarch64"),
    )


def _pip_wheel() -> Path:
    """The pip wheel that ``python -m venv`` installs: CPython's own, or where a distribution keeps it
    (``WHEEL_PKG_DIR``: Debian's python3 has no bundled wheels)."""
    folders = [Path(ensurepip.__file__).parent / "_bundled"]
    if sysconfig.get_config_var("WHEEL_PKG_DIR"):
        folders.append(Path(sysconfig.get_config_var("WHEEL_PKG_DIR")))
    wheels = [wheel for folder in folders for wheel in sorted(folder.glob("pip-*.whl"))]
    assert wheels, f"no pip wheel in {folders}"
    return wheels[0]


def test_a_real_offline_build_from_a_filled_wheelhouse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The "index": a folder with throwaway tensorflow and this Python's own pip wheel.
    index, trees = tmp_path / "index", tmp_path / "trees"
    tf_tree, tree = _project(trees, "tensorflow", "0.0.7"), _project(trees, "mldist", "0.0.3", '"tensorflow"')
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w"]
    subprocess.run([*build, str(index), str(tf_tree)], check=True, env=_offline_env(), timeout=120)
    shutil.copy(_pip_wheel(), index)

    # Login node: build-env fills the wheelhouse (pip told to use the folder) and submits.
    house, venv, out, bindir = tmp_path / "house", tmp_path / "venvs" / "tf", tmp_path / "job", tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    (bindir / "sbatch").chmod(0o755)
    (bindir / "python3").symlink_to(sys.executable)
    for key, value in _offline_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("PIP_NO_BUILD_ISOLATION", "0")  # pip's spelling of "no isolation": setuptools from here
    monkeypatch.setenv("MLDIST_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    argv = ["build-env", "--venv", str(venv), "--scheduler", "slurm", "--gpu", "--gpus-per-node", "0",
            "--source", str(tree), "--wheelhouse", str(house), "--output-dir", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    assert "submitted build job 4242 (slurm)" in said, said
    names = sorted(p.name.split("-")[0] for p in house.glob("*.whl"))
    assert names == ["mldist", "pip", "tensorflow"], names
    task = build_plan(build_parser()[0].parse_args(argv)).spec.command
    assert task[5:] == ("mldist[gpu]==0.0.3", "gpu", "", "", str(house))
    assert f"mldist-build-env {venv} 'mldist[gpu]==0.0.3' gpu '' '' {house}" in (out / "job.sh").read_text()

    # Compute node: the job's program, with no network at all.
    env = _offline_env() | {"MLDIST_JOB_DIR": str(out), "PATH": f"{bindir}:{os.environ['PATH']}"}
    res = subprocess.run([*_no_network(), *task], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"installing from the wheelhouse {house} only" in res.stdout
    assert "imports ok: mldist 0.0.3 tensorflow 0.0.7" in res.stdout, res.stdout
    freeze = (venv / "mldist-build.txt").read_text()
    assert "mldist==0.0.3" in freeze and "tensorflow==0.0.7" in freeze
    assert (out / "mldist-build.txt").read_text() == freeze
