"""``mldist run --max-restarts``: the launcher restarts the whole group (tiny shell workers, no TensorFlow).

Restarts that resume real training from a checkpoint are in training/test_checkpoint.py; a negative
``--max-restarts`` is one of cli/test_cli.py's bad inputs.
"""

from __future__ import annotations

import os

import pytest

from helpers import check, mldist
from mldist.errors import ConfigError
from mldist.launch import elastic, local
from mldist.launch.config import RunConfig

FAIL_FIRST = 'if [ "$MLDIST_RESTART" = 0 ] && [ "$MLDIST_RANK" = 1 ]; then exit 3; fi; echo "ok $MLDIST_RESTART"'


def test_max_restarts_restarts_the_group_after_a_failure() -> None:
    r = check(mldist(["run", "-n", "2", "--max-restarts", "1", "--", "sh", "-c", FAIL_FIRST]))
    assert "restarting the group (1 of 1) after: rank 1 exited with code 3" in r.stderr
    assert "ok 1" in r.stdout


def test_max_restarts_gives_up_and_lists_the_failures() -> None:
    r = check(mldist(["run", "-n", "2", "--max-restarts", "2", "--", "sh", "-c", 'exit "$((MLDIST_RESTART + 4))"']), 6)
    assert "giving up after 2 restart(s)" in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "exited with code 4" in last and "exited with code 5" in last and "exited with code 6" in last


def test_exit_75_is_passed_through_not_restarted() -> None:
    r = mldist(["run", "-n", "2", "--max-restarts", "3", "--", "sh", "-c", 'echo "try $MLDIST_RESTART"; exit 75'])
    check(r, 75)
    assert "restarting" not in r.stderr and "try 1" not in r.stdout


def test_a_fixed_world_restarts_in_a_plain_loop_without_the_elastic_supervisor(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """No --min-np: the rounds are mldist.launch.local's plain loop; the elastic supervisor is elastic runs' only."""

    def refused(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a fixed world built the elastic supervisor")

    monkeypatch.setattr(elastic, "Supervisor", refused)
    assert local.run(RunConfig(nprocs=2, command=("sh", "-c", FAIL_FIRST), max_restarts=1)) == 0
    assert "restarting the group (1 of 1) after: rank 1 exited with code 3" in capfd.readouterr().err


def test_the_world_to_form_on_hosts_is_worked_out_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """-H with --communication mpi: the engine's facts and the check that mpiexec can reach the hosts ask once."""
    asked: list[int] = []
    world = local._world_to_form
    monkeypatch.setattr(local, "_world_to_form", lambda n, env: asked.append(n) or world(n, env))
    cfg = RunConfig(nprocs=2, command=("python", "t.py"), communication="mpi", hosts=(("hx1", 1), ("hx2", 1)))
    try:
        local.launch_plan(cfg, os.environ)
    except ConfigError as exc:  # no mpi4py or mpiexec here: said in one line, after one look all the same
        assert "starts the workers on the other hosts" in str(exc)
    assert asked == [2]
