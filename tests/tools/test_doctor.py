"""``mldist doctor``: each check ok/warn/fail with its fix; exit 0, 1 or 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import clean_env, mldist


def _doctor(**env: str) -> tuple[int, dict[str, dict[str, str]]]:
    res = mldist(["doctor", "--json"], env=clean_env(**env), timeout=60)
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    return res.returncode, checks


def test_workers_on_a_public_address_are_warned_about_with_the_fix() -> None:
    code, checks = _doctor(MLDIST_RANK="0", MLDIST_SIZE="2", MLDIST_WORKERS="8.8.8.8:2222,8.8.4.4:2222")
    net = checks["worker network"]
    assert (code, net["status"]) == (1, "warn")
    assert "8.8.4.4, 8.8.8.8" in net["message"] and "MPI engine" in net["fix"]


def test_workers_on_loopback_pass_the_network_check() -> None:
    code, checks = _doctor(MLDIST_RANK="0", MLDIST_SIZE="2", MLDIST_WORKERS="127.0.0.1:2222,127.0.0.1:2223")
    assert checks["worker network"]["status"] == "ok"
    assert code == max(("ok", "warn", "fail").index(c["status"]) for c in checks.values())


def test_plain_output_is_one_line_per_check_and_a_fix_under_warnings() -> None:
    res = mldist(["doctor"], env=clean_env(MLDIST_RANK="0", MLDIST_SIZE="2", MLDIST_WORKERS="8.8.8.8:1,8.8.8.8:2"))
    lines = res.stdout.splitlines()
    assert any(line.startswith("WARN  worker network: worker address 8.8.8.8") for line in lines)
    assert any(line.strip().startswith("fix: use the MPI engine") for line in lines)


def test_a_tensorflow_that_crashes_with_sigill_is_reported_not_suffered(monkeypatch: pytest.MonkeyPatch) -> None:
    from mldist.tools import checks

    # Stands in for a TensorFlow built for instructions this CPU lacks: the probe process dies of SIGILL.
    monkeypatch.setattr(checks, "_PROBE", "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    results = {name: (status, message, fix) for name, status, message, fix in checks.check_cpu_and_tensorflow({})}
    status, message, fix = results["TensorFlow"]
    assert status == "fail" and "Illegal instruction" in message and "compute node" in fix


@pytest.mark.parametrize(
    ("env", "gpus", "status", "fragment"),
    [
        ({}, 0, "ok", "no GPU visible"),
        ({"MLDIST_RANK": "0", "MLDIST_SIZE": "4", "MLDIST_LOCAL_SIZE": "4"}, 2, "warn", "tasks would share GPUs"),
        ({}, 4, "warn", "one GPU would be used"),
    ],
    ids=["cpu-only", "fewer-gpus-than-tasks", "one-task-many-gpus"],
)
def test_gpus_against_tasks_per_node(env: dict[str, str], gpus: int, status: str, fragment: str) -> None:
    from mldist.tools.checks import _gpu_result

    _, got, message, _ = _gpu_result(env, cuda=True, gpus=gpus)
    assert (got, fragment in message) == (status, True), message


def test_a_run_directory_that_is_a_file_and_a_refused_backend_fail_naming_them(tmp_path: Path) -> None:
    """issue 47: MLDIST_RUN_DIR=/etc/passwd was "OK run directory: /etc is writable" (its parent was
    checked); KERAS_BACKEND=torch, which mldist run refuses, got no word."""
    a_file = tmp_path / "passwd"
    a_file.write_text("not a directory\n")
    code, checks = _doctor(MLDIST_RUN_DIR=str(a_file), KERAS_BACKEND="torch")
    assert code == 2
    run_dir = checks["run directory"]
    assert run_dir["status"] == "fail"
    assert run_dir["message"] == f"MLDIST_RUN_DIR={a_file}: {a_file} is a file, not a directory"
    assert run_dir["fix"] == "set MLDIST_RUN_DIR to a writable directory"
    backend = checks["Keras backend"]
    refused = mldist(["run", "-n", "2", "--", "true"], env=clean_env(KERAS_BACKEND="torch"), timeout=60)
    assert refused.returncode == 2 and backend["status"] == "fail"
    assert refused.stderr.strip() == f"mldist run: error: {backend['message']}"  # what run says, word for word


@pytest.mark.parametrize(
    ("variable", "below", "problem"),
    [
        ("MLDIST_RUNS_DIR", "", "{file} is a file, not a directory"),
        ("MLDIST_RUN_DIR", "/run", "{file} is a file, so {file}/run cannot be made below it"),
        ("MLDIST_RUN_DIR", "/a/b", "{file} is a file, so {file}/a/b cannot be made below it"),
    ],
)
def test_the_run_directory_itself_is_checked_not_its_parent(
    variable: str, below: str, problem: str, tmp_path: Path
) -> None:
    from mldist.tools.checks import check_files

    a_file = tmp_path / "file"
    a_file.write_text("x")
    results = check_files({variable: f"{a_file}{below}"})
    ((status, message, fix),) = [r[1:] for r in results if r[0] == "run directory"]
    assert (status, message) == ("fail", f"{variable}={a_file}{below}: " + problem.format(file=a_file))
    assert fix == f"set {variable} to a writable directory"


def test_a_run_directory_that_can_be_made_or_written_passes(tmp_path: Path) -> None:
    from mldist.tools.checks import check_files

    made = dict((r[0], r[1:]) for r in check_files({"MLDIST_RUN_DIR": str(tmp_path / "new" / "run")}))
    there = dict((r[0], r[1:]) for r in check_files({"MLDIST_RUNS_DIR": str(tmp_path)}))
    assert made["run directory"] == ("ok", f"{tmp_path}/new/run can be made", "")
    assert there["run directory"] == ("ok", f"{tmp_path} is writable", "")
    assert not list(tmp_path.iterdir())  # the probe leaves nothing behind
