"""The test processes' own settings (tests/lean/sitecustomize.py): the garbage collection they run."""

from __future__ import annotations

import json
from typing import Any

from helpers import PY, USERS_GC, check, clean_env, mldist, run_py

SHOW = "import atexit, gc, json; print('GC', json.dumps([gc.get_threshold(), atexit._ncallbacks()]), flush=True)"


def _shown(stdout: str) -> list[list[Any]]:
    return [json.loads(line.split("GC ", 1)[1]) for line in stdout.splitlines() if "GC " in line]


def _plain() -> list[Any]:
    """What a process that collects as a user's does shows."""
    (plain,) = _shown(check(run_py("-c", SHOW, env=clean_env(**USERS_GC))).stdout)
    return plain


def test_test_processes_collect_less_unless_told_to_collect_as_users_do() -> None:
    (lean,), plain = _shown(check(run_py("-c", SHOW)).stdout), _plain()
    young, middle, full = plain[0]
    assert lean[0] == [young, middle, 10 * full]
    assert lean[1] == plain[1] + 1  # the gc.freeze at exit


def test_workers_under_mldist_run_get_what_the_test_chose() -> None:
    full = _plain()[0][2]
    for env, want in ((clean_env(), 10 * full), (clean_env(**USERS_GC), full)):
        rows = _shown(check(mldist(["run", "-n", "2", "--", PY, "-c", SHOW], timeout=60, env=env)).stdout)
        assert [row[0][2] for row in rows] == [want, want]
