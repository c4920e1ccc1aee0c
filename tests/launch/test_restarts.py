"""``mldist run --max-restarts``: the launcher restarts the whole group (tiny shell workers, no TensorFlow).

Restarts that resume real training from a checkpoint are in training/test_checkpoint.py; a negative
``--max-restarts`` is one of cli/test_cli.py's bad inputs.
"""

from __future__ import annotations

from helpers import check, mldist

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
