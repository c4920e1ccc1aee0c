"""The test processes' own settings (tests/lean/sitecustomize.py): the garbage collection they run."""

from __future__ import annotations

import gc
import json

from helpers import PY, USERS_GC, check, clean_env, mldist, run_py

SHOW = "import atexit, gc, json; print('GC', json.dumps([gc.get_threshold(), atexit._ncallbacks()]), flush=True)"


def _shown(stdout: str) -> list[list[object]]:
    return [json.loads(line.split("GC ", 1)[1]) for line in stdout.splitlines() if "GC " in line]


def test_test_processes_collect_less_unless_told_to_collect_as_users_do() -> None:
    young, middle, full = gc.get_threshold()
    (lean,) = _shown(check(run_py("-c", SHOW)).stdout)
    (plain,) = _shown(check(run_py("-c", SHOW, env=clean_env(**USERS_GC))).stdout)
    assert lean[0] == [young, middle, 10 * full] and plain[0] == [young, middle, full]
    assert lean[1] == plain[1] + 1  # the gc.freeze at exit


def test_workers_under_mldist_run_get_what_the_test_chose() -> None:
    for env, full in ((clean_env(), 10 * gc.get_threshold()[2]), (clean_env(**USERS_GC), gc.get_threshold()[2])):
        rows = _shown(check(mldist(["run", "-n", "2", "--", PY, "-c", SHOW], timeout=60, env=env)).stdout)
        assert [row[0][2] for row in rows] == [full, full]
