"""Fixtures for every test folder; shared plain helpers are in helpers.py (``from helpers import ...``)."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# A user's own choice of Keras in their shell (KERAS_BACKEND=jax in ~/.bashrc) would run every test on
# it: each test that wants another backend or Keras 2 asks for it, in this process and in the ones it starts.
for _choice in ("KERAS_BACKEND", "TF_USE_LEGACY_KERAS"):
    os.environ.pop(_choice, None)

# Failed asserts inside the helper modules show their values too, as in test modules.
pytest.register_assert_rewrite("helpers", "harness")

from helpers import ENGINES, PY, ROOT, WORKERS, check, clean_env, mldist, run_py  # noqa: E402 - after the rewrite is registered

# Programs and data, not tests: workers run under the launcher and stand-ins under rendered
# scripts (importing either would run it); fixtures and golden hold captured data and scripts; lean
# is the sitecustomize of the processes tests start (helpers.clean_env).
collect_ignore = ["workers", "fixtures", "standins", "golden", "lean"]


@pytest.fixture
def tag() -> str:
    """A unique string to find a test's processes by."""
    return f"mldist-test-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's main job: examples/digits_cnn.py on 2 workers with a run directory; its console in
    ../console.txt. Shared by the tests of the example's results and of its run directory."""
    base = tmp_path_factory.mktemp("digits")
    run_dir = base / "run"
    args = ["run", "-n", "2", "--run-dir", str(run_dir), "--", PY, str(ROOT / "examples" / "digits_cnn.py")]
    res = check(mldist(args, timeout=600, cwd=base, env=clean_env(MLDIST_PLOT="1")))  # as users get it
    (base / "console.txt").write_text(res.stdout)
    (base / "stderr.txt").write_text(res.stderr)
    return run_dir


@pytest.fixture(scope="session")
def one_process_fit(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``ref(backend)``: the folder of tests/workers/fit_modes.py's equivalence run in one process on
    that Keras backend (its weights-0.npy), run once per session and backend: the reference of the
    2-worker runs on every engine and launcher."""
    done: dict[str, Path] = {}

    def ref(backend: str) -> Path:
        if backend not in done:
            out = tmp_path_factory.mktemp(f"one-process-{backend}")
            argv = [str(WORKERS / "fit_modes.py"), "equivalence", str(out)]
            check(run_py(*argv, timeout=240, env=clean_env(KERAS_BACKEND=backend)))
            done[backend] = out
        return done[backend]

    return ref


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """Each test that takes it runs once per CPU engine."""
    return str(request.param)


#: Tests that must share one pytest-xdist worker, by node id (the scheduler sees only ids): each
#: service's tests (the Slurm cluster, the sshd hosts) one after the other, the two services side by
#: side (their scripts take turns at /etc/hosts and apt: /tmp/mldist-etc-hosts.lock, /tmp/mldist-apt.lock),
#: and the tests that read one run or shared launch of real workers (module- or session-scoped
#: fixtures), so that it happens once.
GROUPS = (
    (r"tests/slurm/", "slurm"),
    (r"tests/(launch/test_hosts|runtime/test_tiers)\.py", "hosts"),
    # One build of the documentation site for the tests that read it.
    (r"tests/docs/test_docs_(site|browser)\.py::", "docs"),
    # One reference run per Keras backend: MPI's and RING's tests share the TensorFlow one.
    (r"tests/training/test_checkpoint\.py::test_(sigkilled|sigterm|corrupted)\w*\[(mpi|ring)\]", "checkpoint-tf"),
    (r"tests/training/test_checkpoint\.py::test_(sigkilled|sigterm|corrupted)\w*\[jax\]", "checkpoint-jax"),
    (
        r"tests/(training/test_runlog\.py::|runtime/test_engine\.py::test_example_reaches_95_percent_with_two_workers\Z"
        r"|runtime/test_own_api\.py::test_the_readme_example)",
        "digits",
    ),
    # The users of the shared launches of tests/runtime/conftest.py and tests/horovod/conftest.py.
    (r"tests/runtime/test_\w+\.py::test_(two_workers_[mus]|collectives_on_two|applied_)\w*\[\w+\]", "engine"),
    (r"tests/runtime/test_jax\.py::test_two_jax_workers_match\w+\[", "engine"),  # one_process_fit
    (
        r"tests/horovod/test_\w+\.py::test_(mismatches|horovods_own|many_collectives_in_one|local_|join_|sync_|the_opt)",
        "hvd",
    ),
    (r"tests/horovod/test_\w+\.py::test_(every_function\w+_3_mpi_\w+|collectives_over_a_process_set\w+\[\w+\])", "hvd"),
)
#: Every group, longest first (one worker's seconds in the CI run of 23838db: Slurm about 650, the hosts
#: about 600, the rest under 200 each). The scheduler hands the groups out in this order, then the single
#: tests: each group is a chain on one worker, and one of the two long chains started late would end
#: after everything else. (xdist's own order, by the number of tests, put the hosts before Slurm and would
#: put the digits group before both once a merge left Slurm with fewer tests.)
LONGEST_FIRST = ("slurm", "hosts", "digits", "engine", "hvd", "checkpoint-jax", "checkpoint-tf", "docs")
#: The fixtures behind those groups: a test that uses one must be in a group (checked at collection).
GROUPED_FIXTURES = (
    "slurm_env",
    "hosts_env",
    "references",
    "digits_run",
    "shared_hvd",
    "shared_engine",
    "one_process_fit",
    "docs_site",
)


def group_of(nodeid: str) -> str | None:
    """The xdist group of a test id, or None (any worker).

    >>> group_of("tests/slurm/test_slurm.py::test_x"), group_of("tests/cli/test_cli.py::test_y")
    ('slurm', None)
    """
    for pattern, name in GROUPS:
        m = re.match(pattern, nodeid)
        if m:
            return m.expand(name)
    return None


def _order(item: pytest.Item) -> tuple[int, int]:
    """Where a test goes: the groups in :data:`LONGEST_FIRST`'s order, then the single slow tests, then the rest."""
    group = group_of(item.nodeid)
    if group is not None:
        if group not in LONGEST_FIRST:
            raise pytest.UsageError(f"group {group!r} ({item.nodeid}): add it to LONGEST_FIRST in tests/conftest.py")
        return 0, LONGEST_FIRST.index(group)
    return 1, 0 if item.get_closest_marker("slow") else 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Check the groups and start the long tests first.

    Under ``pytest -n N`` (scripts/test.sh) the workers take the groups first (longest first:
    :data:`LONGEST_FIRST`), then single tests in this order: those that start worker processes, then
    the many short ones, which fill the gaps at the end instead of a long test starting last.
    """
    for item in items:
        used = [name for name in GROUPED_FIXTURES if name in getattr(item, "fixturenames", ())]
        if used and group_of(item.nodeid) is None:
            raise pytest.UsageError(f"{item.nodeid} uses {used[0]}: add it to GROUPS in tests/conftest.py")
    items.sort(key=_order)  # stable: file order within


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scope scheduler with :func:`group_of` as the scope (one test alone otherwise), in the
    order of the collection (:func:`pytest_collection_modifyitems`), not xdist's largest-count-first."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or nodeid

    return GroupScheduling(config, log)
