"""The Horovod checks that share launches (tests/workers/scenarios.py): one per Keras flavour, one of 3 ranks.

Each of these checks needs ranks of the MPI engine and nothing of its own from the launcher, so one
``mldist run`` runs all their scripts one after another: every rank starts Python,
TensorFlow and mldist once instead of once per check. The tests that use :func:`shared_hvd` form one
pytest-xdist group (tests/conftest.py), so each launch happens once per session.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from helpers import LEGACY_KERAS, check, clean_env, mldist, scenario, scenarios_argv

#: Launch -> (ranks, Keras flavour, the scripts with their arguments in launch order); all on the MPI engine.
SHARED: dict[str, tuple[int, str, list[str]]] = {
    "keras3": (
        2,
        "keras3",
        [
            "hvd_errors.py",
            "hvd_conformance.py",
            "hvd_graph.py eager",
            "hvd_graph.py function",
            "hvd_partial.py",
            "hvd_join.py",
            "hvd_sync_bn.py",
            "hvd_sync_bn.py local",
        ],
    ),
    "tf_keras": (
        2,
        "tf_keras",
        [
            "hvd_errors.py",
            "hvd_conformance.py",
            "hvd_partial.py",
            "hvd_join.py",
            "hvd_sync_bn.py",
            "hvd_optimizer_internals.py",
        ],
    ),
    "keras3-3": (3, "keras3", ["hvd_api.py collectives", "hvd_process_sets.py"]),  # an odd world
}


def _launch(name: str) -> subprocess.CompletedProcess[str]:
    ranks, flavour, keys = SHARED[name]
    argv = ["run", "-n", str(ranks), "--communication", "mpi", "--", *scenarios_argv([k.split() for k in keys])]
    return mldist(argv, timeout=360, env=clean_env(TF_USE_LEGACY_KERAS=LEGACY_KERAS[flavour]))


@pytest.fixture(scope="session")
def shared_hvd() -> Callable[[str, str], str]:
    """``part(launch, key)``: what every rank printed for one script of a launch of :data:`SHARED`.

    The launch runs on first use; if it failed, every test that reads it fails showing its end.
    """
    runs: dict[str, subprocess.CompletedProcess[str]] = {}

    def part(launch: str, key: str) -> str:
        assert key in SHARED[launch][2], f"add {key!r} to SHARED[{launch!r}] in tests/horovod/conftest.py"
        if launch not in runs:
            runs[launch] = _launch(launch)
        return scenario(check(runs[launch]).stdout, key)

    return part
