"""``mldist run -H`` / ``--hostfile``: workers on other hosts through mpiexec's ssh.

The hosts are the project's own (scripts/test-hosts.sh): network namespaces on a private
bridge, each with its own host name and an sshd that takes one key. Without root these tests
skip with the reason; with CI=true hosts that cannot start are a failure.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import PY, ROOT, WORKERS, check, clean_env, mldist, results, start_service, stop_service, tail

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "scripts" / "test-hosts.sh"


@pytest.fixture(scope="module")
def hosts_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """An environment whose mpiexec reaches the test hosts hx1 and hx2 over ssh."""
    config = start_service(SCRIPT, "network namespaces, a bridge, sshd", "MLDIST_TEST_SSH_CONFIG")
    runs = tmp_path_factory.mktemp("runs")
    yield clean_env(PRTE_MCA_plm_ssh_agent=f"ssh -F {config}", MLDIST_RUNS_DIR=str(runs))
    stop_service(SCRIPT)


def _connected(a: dict[str, Any], b: dict[str, Any]) -> bool:
    ends = {tuple(c.split(">")) for c in a["tcp"]}
    return any((remote, local) in ends for local, remote in (c.split(">") for c in b["tcp"]))


def _check_probe(res: subprocess.CompletedProcess[str]) -> None:
    rows = results(res.stdout)
    assert [(r["rank"], r["size"], r["engine"], r["node"]) for r in rows] == [
        (0, 2, "mpi", "hx1"),
        (1, 2, "mpi", "hx2"),
    ]
    assert [r["sum"] for r in rows] == [3.0, 3.0], rows
    assert _connected(rows[0], rows[1]), f"no TCP connection between the ranks: {rows}"


def test_two_ranks_on_two_hosts_share_one_world(hosts_env: dict[str, str], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["run", "-H", "hx1:1,hx2:1", "--run-dir", str(run_dir), "--", PY, str(WORKERS / "mpi_probe.py")]
    res = check(mldist(args, env=hosts_env, timeout=180))
    _check_probe(res)
    # No --network-interface: the network that reaches the hosts, not every interface.
    assert "MPI between the hosts on 172.31.77.0/24, the network that reaches hx1" in res.stderr, tail(res)
    assert [r["tcp_if_include"] for r in results(res.stdout)] == ["172.31.77.0/24"] * 2, tail(res)
    # The run directory on the launching host: config, each rank's log, the summary.
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["engine"], config["ranks"]) == ("mpi", 2)
    for rank in (0, 1):
        assert "RESULT " in (run_dir / f"rank-{rank}.log").read_text()
    assert json.loads((run_dir / "summary.json").read_text())["exit_code"] == 0


def test_a_hostfile_and_the_network_interface(hosts_env: dict[str, str], tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the test hosts\nhx1 slots=1\nhx2:1\n")
    args = ["run", "--hostfile", str(hostfile), "--network-interface", "172.31.77.0/25"]
    res = check(mldist([*args, "--", PY, str(WORKERS / "mpi_probe.py")], env=hosts_env, timeout=180))
    _check_probe(res)
    # Open MPI's TCP transport on every host was told the interface.
    assert [r["tcp_if_include"] for r in results(res.stdout)] == ["172.31.77.0/25"] * 2, tail(res)


#: way -> the line naming the rank that left first. An exception leaves as sys.exit does (mldist's hooks,
#: a nonzero code): it is runtime/test_leave.py's, on one host.
LEAVES = {
    "sysexit": r"mldist run: rank 1 exited with code 3 on hx2; stopping",
    "kill": r"mldist run: rank 1 was killed by SIGKILL \(exit code 137\) on hx2; stopping",
    "exit0": r"\(rank 0\): rank 1 has finished \(exit code 0\)",
}


@pytest.mark.parametrize("way", list(LEAVES))
def test_a_rank_that_leaves_ends_the_job_fast(hosts_env: dict[str, str], way: str) -> None:
    started = time.monotonic()
    args = ["run", "-H", "hx1:1,hx2:1", "--", PY, str(WORKERS / "leave.py"), way, "keep"]
    res = mldist(args, env=hosts_env, timeout=120)
    took = time.monotonic() - started
    assert res.returncode != 0, tail(res)
    assert took < 25, f"took {took:.1f} s\n{tail(res)}"
    assert re.search(LEAVES[way], res.stdout + res.stderr), tail(res)


TERM_WORKER = (
    "import signal, sys, time, mldist; c = mldist.init(); "
    "signal.signal(signal.SIGTERM, lambda *a: (print('TERM', c.rank, flush=True), sys.exit(0))); "
    "print('READY', c.rank, flush=True); time.sleep(120)"
)


def test_sigterm_reaches_every_remote_worker_as_sigterm(hosts_env: dict[str, str]) -> None:
    argv = [PY, "-m", "mldist", "run", "-H", "hx1:1,hx2:1", "--", PY, "-c", TERM_WORKER]
    proc = subprocess.Popen(argv, env=hosts_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 120
    while sum("READY" in line for line in seen) < 2 and time.monotonic() < deadline:
        seen.append(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    text = "".join(seen) + out
    assert "[0] TERM 0" in text and "[1] TERM 1" in text, text
    assert proc.returncode == 0, text


RESTARTED = (
    "import os, sys, mldist, tensorflow as tf; c = mldist.init(); r = int(os.environ['MLDIST_RESTART']); "
    "mldist.allreduce(tf.ones([2])); "
    "sys.exit(3) if (r, c.rank) == (0, 1) else print('done', r, c.rank, flush=True)"
)


def test_max_restarts_starts_every_remote_rank_again(hosts_env: dict[str, str]) -> None:
    args = ["run", "-H", "hx1:1,hx2:1", "--max-restarts", "1", "--no-run-dir", "--", PY, "-c", RESTARTED]
    res = check(mldist(args, env=hosts_env, timeout=240))
    assert "restarting the group (1 of 1) after: rank 1 exited with code 3 on hx2" in res.stderr, tail(res)
    assert "[0] done 1 0" in res.stdout and "[1] done 1 1" in res.stdout, tail(res)


def test_a_stuck_rank_on_another_host_is_named_with_its_line(hosts_env: dict[str, str]) -> None:
    """tests/runtime/test_late.py's sleeping rank on hx2: the run directory (on this host's file
    system, which the test hosts share) holds every rank's progress."""
    env = {**hosts_env, "MLDIST_COLLECTIVE_TIMEOUT": "15"}
    res = mldist(["run", "-H", "hx1:1,hx2:1", "--", PY, str(WORKERS / "late.py"), "sleep"], env=env, timeout=150)
    assert res.returncode != 0, tail(res)
    line = next((x for x in res.stderr.splitlines() if "rank 1 has not reached collective #" in x), "")
    assert "late.py:" in line and "time.sleep(600)" in line, tail(res)


def test_the_keras_guide_forms_one_group_across_hosts(hosts_env: dict[str, str], tmp_path: Path) -> None:
    """keras.distribution.initialize() alone on hx1 and hx2: rank 0's host and a port from mldist."""
    args = ["run", "-H", "hx1:1,hx2:1", "--no-run-dir", "--", PY, str(WORKERS / "keras_guide.py"), str(tmp_path)]
    res = check(mldist(args, env={**hosts_env, "KERAS_BACKEND": "jax"}, timeout=240))
    assert [(r["processes"], r["devices"]) for r in results(res.stdout)] == [(2, 2), (2, 2)], tail(res)
    assert np.array_equal(np.load(tmp_path / "weights-0.npy"), np.load(tmp_path / "weights-1.npy"))
