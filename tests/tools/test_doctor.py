"""``mldist doctor``: each check ok/warn/fail with its fix; exit 0, 1 or 2."""

from __future__ import annotations

import json

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
