"""The engine checks that share one launch per engine (tests/workers/scenarios.py).

Each needs 2 ranks of one engine and nothing of its own from the launcher, so one ``mldist run`` per
engine runs all their scripts one after another: every rank starts Python, TensorFlow and mldist
once instead of once per check. The tests that use :func:`shared_engine` form one pytest-xdist group
(tests/conftest.py), so each launch happens once per session.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import check, clean_env, mldist, scenario, scenarios_argv

#: Name -> the script and its arguments (OUT: the scenario's own empty folder), in launch order.
SHARED = {
    "strategy": ["strategy_sum.py"],
    "threads": ["threads.py"],
    "collectives": ["collectives.py"],
    "equivalence": ["fit_modes.py", "equivalence", "OUT"],
    "meangrad": ["fit_modes.py", "meangrad", "OUT"],
    "patience": ["patience.py"],
    "overlap": ["overlap.py"],
}


def _launch(engine: str, base: Path) -> subprocess.CompletedProcess[str]:
    for name in SHARED:
        (base / name).mkdir(parents=True)
    runs = [[str(base / name) if arg == "OUT" else arg for arg in run] for name, run in SHARED.items()]
    argv = ["run", "-n", "2", "--communication", engine, "--", *scenarios_argv(runs)]
    # A proxy as on a login node: the workers' no_proxy must keep their own traffic local.
    return mldist(argv, timeout=360, env=clean_env(https_proxy="http://proxy.invalid:3128"))


@pytest.fixture(scope="session")
def shared_engine(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], tuple[str, Path]]:
    """``part(engine, name)``: what both ranks printed for one script of that engine's shared launch,
    and the script's own folder (its OUT). The launch runs on first use; if it failed, every test that
    reads it fails showing its end."""
    runs: dict[str, tuple[subprocess.CompletedProcess[str], Path]] = {}

    def part(engine: str, name: str) -> tuple[str, Path]:
        if engine not in runs:
            base = tmp_path_factory.mktemp(f"shared-{engine}")
            runs[engine] = (_launch(engine, base), base)
        res, base = runs[engine]
        run = SHARED[name]
        key = " ".join(str(base / name) if arg == "OUT" else arg for arg in run)
        return scenario(check(res).stdout, key), base / name

    return part
