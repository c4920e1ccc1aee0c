"""``mldist run -H`` / ``--hostfile``: workers on other hosts through mpiexec's ssh.

The hosts are the project's own (scripts/test-hosts.sh): network namespaces on a private
bridge, each with its own host name and an sshd that takes one key. Without root these tests
skip with the reason; with CI=true hosts that cannot start are a failure.
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
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
HOSTS = {"MLDIST_HOSTS": "3"}  # the elastic test loses hx3; the others use hx1 and hx2


@pytest.fixture(scope="module")
def hosts_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """An environment whose mpiexec reaches the test hosts hx1, hx2 and hx3 over ssh."""
    config = start_service(SCRIPT, "network namespaces, a bridge, sshd", "MLDIST_TEST_SSH_CONFIG", HOSTS)
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


def _kill_host(index: int) -> None:
    """Every process of test host hx<index> (its sshd, Open MPI's daemon, the shim, the worker), with SIGKILL."""
    pids = subprocess.run(["ip", "netns", "pids", f"mld-hx{index}"], capture_output=True, text=True).stdout.split()
    assert pids, f"nothing runs on hx{index}"
    subprocess.run(["kill", "-KILL", *pids], check=False)


def _watch(argv: list[str], env: dict[str, str], until: str, then: Any) -> tuple[int, list[tuple[float, str]]]:
    """Run ``argv``; call ``then()`` once a line holds ``until``; every line with the time it came."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[tuple[float, str]] = []
    assert proc.stdout is not None
    done = False
    for line in proc.stdout:
        lines.append((time.monotonic(), line.rstrip("\n")))
        if not done and until in line:
            then()
            lines.append((time.monotonic(), "TEST: killed"))
            done = True
    return proc.wait(timeout=60), lines


@pytest.mark.parametrize("api", ["hvd", "keras"])
def test_a_lost_host_re_forms_the_world_on_the_others(hosts_env: dict[str, str], tmp_path: Path, api: str) -> None:
    """Every process of hx3 killed during epoch 2 of a 3-host elastic run: it goes on with 2 workers from
    the last commit, and ends with the weights of a 2-host run started from that commit. Horovod's
    hvd.elastic (elastic_fit.py) and mldist's own mldist.keras.Elastic (elastic_keras.py)."""
    worker = WORKERS / ("elastic_fit.py" if api == "hvd" else "elastic_keras.py")
    elastic, reference = tmp_path / "elastic", tmp_path / "reference"
    elastic.mkdir(), reference.mkdir()
    args = ["-m", "mldist", "run", "-H", "hx1:1,hx2:1,hx3:1", "--min-np", "2", "--run-dir", str(elastic / "run")]
    try:
        code, lines = _watch([PY, *args, "--", PY, str(worker), str(elastic)], hosts_env, "EPOCH 2 BEGIN 3", _kill_hx3)
    finally:
        start_service(SCRIPT, "network namespaces, a bridge, sshd", "MLDIST_TEST_SSH_CONFIG", HOSTS)  # hx3 back
    text = "\n".join(line for _, line in lines)
    assert code == 0, text[-4000:]
    killed = next(t for t, line in lines if line == "TEST: killed")
    resumed = next(t for t, line in lines if t > killed and "FIRST STEP" in line)
    print(f"{api}: from the kill of hx3 to the first step on 2 hosts: {resumed - killed:.1f} s")
    assert "lost host hx3 (does not answer over ssh); re-forming the world on hx1,hx2: 2 worker(s)" in text, text
    assert re.search(r"mldist run: training again [0-9.]+ s after losing hx3 \(2 worker\(s\)\)", text), text
    assert "EPOCH 4 BEGIN 2" in text and "DONE 0 2" in text, text
    (reform,) = json.loads((elastic / "run" / "summary.json").read_text())["elastic"]["reforms"]
    assert (reform["lost"], reform["before"], reform["after"]) == (["hx3"], 3, 2)
    assert 0 < reform["loss_to_resume_s"] < 120, reform
    # A world of hx1 and hx2 started from the commit the elastic run resumed from ends with the same weights.
    (_prepare_hvd_reference if api == "hvd" else _prepare_keras_reference)(lines, killed, elastic, reference)
    ref = ["run", "-H", "hx1:1,hx2:1", "--no-run-dir", "--", PY, str(worker), str(reference), "reference"]
    res = check(mldist(ref, env={**hosts_env, "STEP_S": "0"}, timeout=240))
    got, want = np.load(elastic / "final.npy"), np.load(reference / "final.npy")
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
    if api == "keras":  # scale_lr's rate for 2 workers, set again after the resume (the commit held 3's)
        assert "[0] LR 0.04" in text and "[0] LR 0.04" in res.stdout, text


def _kill_hx3() -> None:
    _kill_host(3)


def _prepare_hvd_reference(lines: list[tuple[float, str]], killed: float, elastic: Path, reference: Path) -> None:
    """hvd: the state the reset callback saved; it is the last commit made before the kill."""
    commits = [line.split() for t, line in lines if t < killed and line.startswith("[0] COMMIT")]
    state = pickle.loads((elastic / "resumed.pkl").read_bytes())
    assert commits and state["values"]["epoch"] == int(commits[-1][3]), commits
    shutil.copy(elastic / "resumed.pkl", reference / "resumed.pkl")


def _prepare_keras_reference(lines: list[tuple[float, str]], killed: float, elastic: Path, reference: Path) -> None:
    """mldist.keras.Elastic: rank 0's commits on disk, without those made after the one it resumed from."""
    said = next(line for t, line in lines if t > killed and "mldist: elastic: resumed: step" in line)
    step = int(re.search(r"step ([0-9]+) from (\S+)", said).group(1))  # type: ignore[union-attr]
    assert re.search(r"from hx[12];", said), said  # a host's memory copy, not the disk
    shutil.copytree(elastic / "run" / "elastic", reference / "elastic")
    for ckpt in (reference / "elastic").glob("ckpt-*"):
        if int(ckpt.name.split("-")[1]) > step:
            shutil.rmtree(ckpt)
