"""Which workers watch their launcher: those in a group that ``mldist run`` made for them, and no other."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHECK = "import os, sys; from mldist.runtime.watch import watchdog; "
CHECK += "print(watchdog._in_own_group(int(sys.argv[1]), os.environ))"


def _in_own_group(extra: dict[str, str], **how: bool) -> str:
    """What ``_in_own_group`` says in a child started ``how`` (a new session, or a new process group)."""
    group = {"process_group": 0} if how.get("group") else {}
    env = {**os.environ, **extra}
    res = subprocess.run(
        [sys.executable, "-c", CHECK, str(os.getpid())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        start_new_session=how.get("session", False),
        **group,  # type: ignore[arg-type]
    )
    return res.stdout.strip()


def test_a_new_session_is_the_workers_own() -> None:
    assert _in_own_group({}, session=True) == "True"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Popen(process_group=) is new in Python 3.11")
def test_a_new_group_is_the_workers_own_only_where_mldist_run_says_so() -> None:
    """The shim's workers get MLDIST_WORKER_GROUP=1; a group without it (a shell's job) is left alone."""
    assert _in_own_group({"MLDIST_WORKER_GROUP": "1"}, group=True) == "True"
    assert _in_own_group({}, group=True) == "False"


def test_the_launchers_own_group_is_never_the_workers() -> None:
    assert _in_own_group({"MLDIST_WORKER_GROUP": "1"}) == "False"
