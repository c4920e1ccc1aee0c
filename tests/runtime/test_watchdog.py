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
def test_a_new_group_is_the_workers_own_only_when_the_shim_names_it() -> None:
    """The shim's group is named by MLDIST_WORKER_GROUP; a group the variable does not name (a shell's job) is not."""
    assert _in_own_group({"MLDIST_WORKER_GROUP": "1"}, group=True) == "False"
    assert _in_own_group({}, group=True) == "False"
    named = "import os, subprocess, sys; os.environ['MLDIST_WORKER_GROUP'] = str(os.getpid()); "
    named += "sys.exit(subprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2]]).returncode)"
    res = subprocess.run(
        [sys.executable, "-c", named, CHECK, str(os.getpid())],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        process_group=0,
    )
    assert res.stdout.strip() == "True"  # a child of the group's leader (a wrapper's python) watches too


def test_the_launchers_own_group_is_never_the_workers() -> None:
    assert _in_own_group({"MLDIST_WORKER_GROUP": str(os.getpgrp())}) == "False"
