"""The per-rank shim of ``mldist run`` under mpiexec: one small standard-library Python, set up by the launcher.

Each test starts the real shim as the launcher does (``python -I -S .../launch/shim.py RUN_DIR -- CMD``) with
mpiexec's rank variable and a ``start-R`` file from :func:`mldist.launch.mpiexec.start_file`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import PY, check, mldist
from mldist.base import envvalues
from mldist.launch import procs, shim
from mldist.launch.mpiexec import rank_variables, shim_argv, start_file
from mldist.placement.detect import LAUNCHERS


def test_the_shim_spells_the_rank_variables_and_signals_of_the_tables() -> None:
    mpi_rows = [rule.fields["rank"][0] for rule in LAUNCHERS if rule.name in ("openmpi", "pals", "mpich", "aprun")]
    assert list(shim.RANK_VARIABLES) == mpi_rows
    assert shim.FORWARDED == procs.FORWARDED


def _run_shim(run_dir: Path, command: list[str], own: dict[str, str], env: dict[str, str]) -> str:
    """Run rank 1's shim with ``-X importtime`` and its log ``rank-1.log``; the shim's own stderr (the import lines)."""
    log = run_dir / "rank-1.log"
    (run_dir / "start-1").write_bytes(start_file([str(log), "", os.devnull], [], own))
    argv = shim_argv(run_dir)
    res = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:], *command],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "OMPI_COMM_WORLD_RANK": "1", **env},
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stderr


def _log(run_dir: Path) -> str:
    """The worker's log without the lines of ``-X importtime`` (os.execvp imports warnings in the child)."""
    lines = (run_dir / "rank-1.log").read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("import time:"))


def test_the_shim_imports_no_mldist_and_hands_the_worker_its_variables_streams_and_code(tmp_path: Path) -> None:
    own = rank_variables({"KEPT": "mpiexec's"}, 1, 2, ["h:1", "h:2"], 0) | {"KEPT": "the file's", "X": "x"}
    script = 'echo "$MLDIST_RANK $RANK $WORLD_SIZE $X $KEPT"; echo to-stderr >&2; exit 3'
    imports = _run_shim(tmp_path, ["sh", "-c", script], own, {"KEPT": "mpiexec's"})
    modules = [line.split("|")[-1].strip() for line in imports.splitlines() if line.startswith("import time:")]
    assert not [m for m in modules if m.startswith("mldist")], modules
    assert len(modules) < 60, modules  # the shim that imported mldist loaded 153
    # mpiexec's own value wins (as a user's --mca would), the rest is the launcher's
    assert _log(tmp_path) == "1 1 2 x mpiexec's\nto-stderr\n"
    code, at = (tmp_path / "exit-1").read_text().split()
    assert code == "3" and float(at) > 0
    assert int((tmp_path / "pid-1").read_text()) > 0
    assert not list(tmp_path.glob("*.tmp"))


def test_a_worker_killed_by_a_signal_is_recorded_as_the_signal(tmp_path: Path) -> None:
    _run_shim(tmp_path, ["sh", "-c", "kill -9 $$"], {}, {})
    assert (tmp_path / "exit-1").read_text().split()[0] == "-9"


def test_a_command_that_cannot_start_is_recorded_with_127_and_why(tmp_path: Path) -> None:
    _run_shim(tmp_path, [str(tmp_path / "missing")], {}, {})
    code, _, why = (tmp_path / "exit-1").read_text().split(" ", 2)
    assert code == "127" and why == f"cannot start {str(tmp_path / 'missing')!r}: No such file or directory\n"


def test_the_worker_gets_only_its_streams_and_a_process_group_of_its_own(tmp_path: Path) -> None:
    """Its own group (the launcher signals it), but the shim's session: a new session is a new scheduling
    autogroup, and 64 of them starved the shims still starting ranks."""
    extra = os.open(os.devnull, os.O_RDONLY)  # an inheritable descriptor the shim got from mpiexec
    os.set_inheritable(extra, True)
    log = tmp_path / "rank-1.log"
    try:
        (tmp_path / "start-1").write_bytes(start_file([str(log), "", os.devnull], [], {}))
        code = "import os; print(sorted(os.listdir('/proc/self/fd')), os.getpgrp() == os.getpid(), "
        code += "os.getsid(0) == os.getsid(os.getppid()))"
        res = subprocess.run(
            [*shim_argv(tmp_path), sys.executable, "-I", "-S", "-c", code],
            env={"PATH": os.environ["PATH"], "OMPI_COMM_WORLD_RANK": "1"},
            pass_fds=(extra,),
            timeout=120,
        )
    finally:
        os.close(extra)
    assert res.returncode == 0
    assert log.read_text() == "['0', '1', '2', '3'] True True\n"  # (3: the listing's own descriptor)


def test_the_worker_gets_sigpipe_back(tmp_path: Path) -> None:
    """Python ignores SIGPIPE and exec keeps what is ignored: a worker writing to a closed pipe must die of it."""
    _run_shim(tmp_path, ["grep", "^SigIgn", "/proc/self/status"], {}, {})
    ignored = int(_log(tmp_path).split()[1], 16)
    assert not ignored & (1 << (13 - 1))  # SIGPIPE is 13


@pytest.mark.parametrize("rank_variable", ["PMI_RANK", "PALS_RANKID"])
def test_other_mpis_rank_variables_are_read(tmp_path: Path, rank_variable: str) -> None:
    (tmp_path / "start-1").write_bytes(start_file([str(tmp_path / "log"), "", os.devnull], [], {}))
    env = {"PATH": os.environ["PATH"], rank_variable: "1"}
    subprocess.run([*shim_argv(tmp_path), "true"], env=env, check=True, timeout=120)
    assert (tmp_path / "exit-1").read_text().split()[0] == "0"


def test_without_a_rank_variable_the_shim_says_so_and_starts_nothing(tmp_path: Path) -> None:
    res = subprocess.run(
        [*shim_argv(tmp_path), "true"], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2 and "OMPI_COMM_WORLD_RANK" in res.stderr and not list(tmp_path.iterdir())


def test_rank_variables_give_each_rank_its_place_and_keep_a_users_own() -> None:
    got = rank_variables({"WORLD_SIZE": "9", "OMP_NUM_THREADS": "4"}, 3, 4, ["h:1"] * 4, 2)
    assert got[envvalues.WORKER_GROUP.name] == "1"  # the shim's process group: the worker's watchdog takes it
    assert got[envvalues.RANK.name] == "3" and got[envvalues.LOCAL_SIZE.name] == "4" and got["LOCAL_RANK"] == "3"
    assert "WORLD_SIZE" not in got and "OMP_NUM_THREADS" not in got
    assert rank_variables({}, 0, 2, [], 3)["OMP_NUM_THREADS"] == "3"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to split")
def test_through_mpiexec_each_rank_gets_its_cpus_and_place_from_the_launchers_start_file() -> None:
    """A real ``mldist run --communication mpi --cpu-bind cores``: the launcher's start files reach each worker."""
    code = "import os, json; print(json.dumps([sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'], "
    code += "os.environ['RANK'], os.environ['OMPI_COMM_WORLD_RANK'], os.environ.get('MLDIST_HOOK_SKIP')]))"
    argv = ["run", "-n", "2", "--communication", "mpi", "--cpu-bind", "cores", "--no-run-dir", "--", PY, "-c", code]
    res = check(mldist(argv))
    rows = sorted(json.loads(line.split(" ", 1)[1]) for line in res.stdout.splitlines() if line.startswith("["))
    assert [r[2:] for r in rows] == [["0", "0", None], ["1", "1", None]], rows  # no hook switched off in the worker
    assert all(r[0] and r[1] == str(len(r[0])) for r in rows) and not set(rows[0][0]) & set(rows[1][0]), rows
