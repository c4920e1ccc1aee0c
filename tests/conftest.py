"""Shared helpers: run the real CLI in subprocesses, find leftover processes."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

# Worker scripts run as programs under the launcher; importing them would run them.
collect_ignore = ["workers", "fixtures"]

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without launcher variables, plus ``extra``."""
    prefixes = ("MLDIST_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "PALS_", "ALPS_", "PBS_", "TF_CONFIG")
    # Thread variables too: an in-process mldist.init() in an earlier test may have set them.
    threads = ("OMP_NUM_THREADS", "KMP_BLOCKTIME", "KMP_AFFINITY")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes) and k not in threads}
    env.update(extra)
    return env


def mldist(args: Sequence[str], timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run ``python -m mldist ARGS`` and capture its output."""
    env = kw.pop("env", None) or clean_env()
    return subprocess.run(
        [PY, "-m", "mldist", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def processes_with(tag: str) -> list[str]:
    """Command lines of live processes that contain ``tag``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        cmd = raw.replace(b"\0", b" ").decode(errors="replace")
        if tag in cmd and "pytest" not in cmd:
            found.append(f"{pid}: {cmd}")
    return found


@pytest.fixture
def tag() -> str:
    """A unique string to find a test's processes by."""
    return f"mldist-test-{uuid.uuid4().hex[:10]}"
