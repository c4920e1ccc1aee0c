"""Shared test helpers: run the real CLI in subprocesses, read its output, find leftover processes.

Importable from every test folder as ``from helpers import ...`` (``pythonpath`` in the
``[tool.pytest.ini_options]`` of pyproject.toml). Fixtures live in the conftest.py files.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
WORKERS = TESTS / "workers"  # worker programs run under the launcher (never imported)
#: On PYTHONPATH of every process a test starts: TensorFlow's optional imports, less garbage collection
#: (lean/sitecustomize.py).
LEAN = TESTS / "lean"
#: For :func:`clean_env` in the tests whose subject is how a worker ends: the processes collect garbage
#: as a user's do, at exit too (lean/sitecustomize.py collects less elsewhere).
USERS_GC = {"MLDIST_TESTS_LEAN_GC": "0"}
PY = sys.executable
#: The collective engines of CPU workers; `mldist run --communication ENGINE` picks one.
ENGINES = ("mpi", "ring")
#: ENGINES and "jax" (Keras on JAX: KERAS_BACKEND=jax), for tests that hold on both backends.
BACKEND_ENGINES = (*ENGINES, "jax")
#: Keras flavour -> TF_USE_LEGACY_KERAS: Keras 3, or tf_keras (Keras 2) for tf.keras.
LEGACY_KERAS = {"keras3": "0", "tf_keras": "1"}

#: How much of each output stream a failure message shows (the end: where the error is).
TAIL = 3000


#: Open MPI session directories of this test session's launches (removed at exit): a killed prterun
#: leaves ``/tmp/ompi.<pid>`` behind, and a later one that gets the same pid cannot start its PMIx
#: listener. ``mldist run`` keeps its own in a private folder; bare mpiexec/mpirun calls get one here.
_PRTE_BASE = Path(tempfile.mkdtemp(prefix="mldist-tests-prte-"))
atexit.register(shutil.rmtree, _PRTE_BASE, True)
#: JAX's persistent compilation cache, shared by the JAX workers this pytest process starts (removed at
#: exit). The suite runs the same few Keras models on JAX in many workers, and each compiled them again:
#: test_checkpoint.py's 12 JAX workers took 123 CPU-s without it, 108 with it. The first worker of each
#: model still compiles it.
_JAX_CACHE = Path(tempfile.mkdtemp(prefix="mldist-tests-jax-cache-"))
atexit.register(shutil.rmtree, _JAX_CACHE, True)


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without launcher variables, plus ``extra``.

    Each call gets its own Open MPI session directory base (``PRTE_MCA_prte_tmpdir_base``),
    :data:`LEAN` first on ``PYTHONPATH`` unless ``extra`` sets it, ``MLDIST_PLOT=0``, this
    process's JAX compilation cache (``JAX_COMPILATION_CACHE_DIR``) and less garbage collection
    (``MLDIST_TESTS_LEAN_GC=1``, unless ``extra`` has :data:`USERS_GC`).
    """
    prefixes = ("MLDIST_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "PALS_", "ALPS_", "PBS_", "TF_CONFIG")
    # Thread variables too: an in-process mldist.init() in an earlier test may have set them.
    threads = ("OMP_NUM_THREADS", "KMP_BLOCKTIME", "KMP_AFFINITY")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes) and k not in threads}
    # Default run directories of `mldist run` go to a scratch folder, not into the checkout.
    env["MLDIST_RUNS_DIR"] = str(Path(tempfile.gettempdir()) / "mldist-test-runs")
    # RunLog's metrics.png costs rank 0 a matplotlib import and a drawing (about a second) in every
    # Keras launch; the tests of the plot ask for it (MLDIST_PLOT="1").
    env["MLDIST_PLOT"] = "0"
    env["PRTE_MCA_prte_tmpdir_base"] = tempfile.mkdtemp(dir=_PRTE_BASE)
    env["JAX_COMPILATION_CACHE_DIR"] = str(_JAX_CACHE)
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # JAX's default (1 s) skips most compiles here
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(LEAN), env.get("PYTHONPATH"))))
    env["MLDIST_TESTS_LEAN_GC"] = "1"
    env.update(extra)
    return env


def engine_launch(engine: str) -> tuple[list[str], dict[str, str]]:
    """``mldist run``'s engine arguments and the environment for one of :data:`BACKEND_ENGINES`."""
    if engine == "jax":
        return ["--communication", "auto"], clean_env(KERAS_BACKEND="jax")
    return ["--communication", engine], clean_env()


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


def run_py(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` (no launcher: one process) in a clean environment and capture its output."""
    return subprocess.run([PY, *args], capture_output=True, text=True, env=env or clean_env(), timeout=timeout)


def tail(res: subprocess.CompletedProcess[str], chars: int = TAIL) -> str:
    """The exit code and the last ``chars`` characters of stdout and of stderr: a failure message."""
    return f"exit {res.returncode}\n--- stdout (tail)\n{res.stdout[-chars:]}\n--- stderr (tail)\n{res.stderr[-chars:]}"


def check(res: subprocess.CompletedProcess[str], code: int = 0) -> subprocess.CompletedProcess[str]:
    """Assert the exit code; on failure show the trimmed end of both outputs. Returns ``res``."""
    assert res.returncode == code, tail(res)
    return res


def results(stdout: str) -> list[dict[str, Any]]:
    """The ``RESULT {json}`` lines workers print (any prefix before them), sorted by their ``rank``."""
    rows = [json.loads(line.split("RESULT ", 1)[1]) for line in stdout.splitlines() if "RESULT " in line]
    return sorted(rows, key=lambda r: int(r["rank"]))


def scenarios_argv(runs: Sequence[Sequence[str]]) -> list[str]:
    """``python tests/workers/scenarios.py`` and its arguments for several scripts (each with its arguments).

    >>> scenarios_argv([["a.py", "x"], ["b.py"]])[2:]
    ['a.py', 'x', '+', 'b.py']
    """
    args: list[str] = []
    for run in runs:
        args += [*(["+"] if args else []), *run]
    return [PY, str(WORKERS / "scenarios.py"), *args]


def scenario(stdout: str, key: str) -> str:
    """The lines that each rank printed for one script of tests/workers/scenarios.py (prefix kept).

    Fails naming ``key`` unless every rank that began it also ended it.

    >>> marks = ["[0] SCENARIO BEGIN a.py", "[1] SCENARIO BEGIN a.py", "[1] x", "[0] SCENARIO END a.py"]
    >>> scenario("\\n".join([*marks, "[1] SCENARIO END a.py"]), "a.py")
    '[1] x'
    """
    current: dict[str, str] = {}
    lines: list[str] = []
    begun: set[str] = set()
    ended: set[str] = set()
    for line in stdout.splitlines():
        prefix, _, text = line.partition(" ")
        if text.startswith(("SCENARIO BEGIN ", "SCENARIO END ")):
            mark, name = text.split(" ", 2)[1:]
            current[prefix] = name if mark == "BEGIN" else ""
            if name == key:
                (begun if mark == "BEGIN" else ended).add(prefix)
        elif current.get(prefix) == key:
            lines.append(line)
    assert begun and begun == ended, f"scenario {key!r}: begun on {sorted(begun)}, ended on {sorted(ended)}"
    return "\n".join(lines)


def cmdlines() -> Iterator[tuple[int, str]]:
    """``(pid, command line)`` of every live process (arguments joined by spaces)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        yield int(pid), raw.replace(b"\0", b" ").decode(errors="replace")


def processes_with(tag: str) -> list[str]:
    """Command lines of live processes that contain ``tag`` (pytest's own excluded)."""
    return [f"{pid}: {cmd}" for pid, cmd in cmdlines() if tag in cmd and "pytest" not in cmd]


def wait_for(what: Callable[[], bool], timeout: float, message: str) -> None:
    """Poll ``what`` every 50 ms; fail the test naming ``message`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {message}")
        time.sleep(0.05)


def wait_for_progress(folder: Path, ranks: int, timeout: float) -> None:
    """Wait until ``ranks`` ranks have published a record with a finished collective in ``folder``."""
    from mldist.base import progress

    def ready() -> bool:
        records = progress.read(folder)
        return len(records) >= ranks and all(r.finished >= 1 for r in records.values())

    wait_for(ready, timeout, f"{ranks} ranks' progress records in {folder}")


def start_service(script: Path, needs: str, export: str, env: dict[str, str] | None = None) -> str:
    """``bash SCRIPT start`` for a test service that needs root; the value its last line exports.

    Without root the test skips, naming ``needs``; with CI=true that, or a service that does not
    start, fails: CI must run these tests.

    Args:
        script: scripts/slurm-cluster.sh, scripts/test-hosts.sh, ...
        needs: what root is needed for, for the message.
        export: the variable of the script's last line, ``export NAME=VALUE``.
        env: the script's knobs (e.g. ``MLDIST_HOSTS``), over this process's environment.
    """
    if os.geteuid() != 0:
        cannot_here(f"{script.name} needs root ({needs})")
    res = subprocess.run(
        ["bash", str(script), "start"], capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})}
    )
    if res.returncode != 0:
        pytest.fail(f"{script.name} start failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return res.stdout.strip().splitlines()[-1].removeprefix(f"export {export}=")


def stop_service(script: Path) -> None:
    """``bash SCRIPT stop``: stops only what the script started."""
    subprocess.run(["bash", str(script), "stop"], capture_output=True, text=True, timeout=120)


class Probe:
    """Stands in for joining the MPI world (``mldist.placement.engines.gather``'s ``mpi``): counts the calls."""

    def __init__(self, world: Any) -> None:
        self.world, self.calls = world, 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.world


def cannot_here(reason: str) -> None:
    """Skip a test this machine cannot run (a missing tool, a limit), or fail it under CI, which must run it."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason + "; CI must run this test")
    # The one skip of the suite: a developer's machine without root, a tool or a limit runs the rest;
    # under CI (CI=true in its environment) the test fails instead, so nothing is skipped where it counts.
    pytest.skip(reason)


def small_disk(where: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` (``200k``, ``8m``) mounted at ``where`` for a test, unmounted after it: a disk
    that fills. Needs root (skipped without; CI must run these tests)."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        cannot_here(f"a small tmpfs needs root and mount ({mounted.stderr.strip()})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(disk: Path, leave: int = 0) -> None:
    """Fill ``disk`` (a :func:`small_disk`) with one file until at most ``leave`` bytes are free."""
    free = shutil.disk_usage(disk).free - leave
    with contextlib.suppress(OSError), open(disk / "filler", "wb") as fh:
        fh.write(bytes(max(free, 0)))
        fh.flush()
        os.fsync(fh.fileno())
