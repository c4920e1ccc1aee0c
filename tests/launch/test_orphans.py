"""No process left behind: killing ``mldist run`` with SIGKILL ends every worker, even behind a forking wrapper."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import PY, ROOT, clean_env, cmdlines, wait_for


def processes_with(tag: str) -> list[str]:
    """Live processes whose command line has ``tag`` (the paths contain "pytest": helpers' filter would drop them)."""
    return [f"{pid}: {cmd}" for pid, cmd in cmdlines() if tag in cmd and pid != os.getpid()]


WORKER = "import mldist, pathlib, sys, time; mldist.init(); pathlib.Path(sys.argv[1]).touch(); time.sleep(600)"


@pytest.mark.slow
def test_sigkill_of_the_launcher_ends_workers_behind_a_forking_wrapper(tmp_path: Path, tag: str, engine: str) -> None:
    # The wrapper runs python without exec and does something after it: the shell must fork.
    wrapper = tmp_path / "train.sh"
    wrapper.write_text(f'#!/bin/sh\n"{PY}" -c "{WORKER}" "$1/ready-$MLDIST_RANK" {tag}\necho finished\n')
    wrapper.chmod(0o700)
    cmd = [PY, "-m", "mldist", "run", "-n", "2", "--communication", engine, "--", str(wrapper), str(tmp_path)]
    launcher = subprocess.Popen(cmd, env=clean_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ready = [tmp_path / "ready-0", tmp_path / "ready-1"]
        wait_for(lambda: all(p.exists() for p in ready), 120, "both workers to finish mldist.init()")
        pythons = [p for p in processes_with(tag) if "mldist.init()" in p]
        assert len(pythons) == 2, pythons  # the workers really run behind the wrapper
        os.kill(launcher.pid, signal.SIGKILL)
        wait_for(lambda: not processes_with(tag), 10, f"the workers to die with the launcher: {processes_with(tag)}")
    finally:
        launcher.kill()
        launcher.wait()
        for line in processes_with(tag):
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
