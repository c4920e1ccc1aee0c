"""``mldist run -H`` / ``--hostfile``: workers on other hosts through mpiexec's ssh.

The hosts are the project's own (scripts/test-hosts.sh): network namespaces on a private
bridge, each with its own host name and an sshd that takes one key. Without root these tests
skip with the reason; with CI=true hosts that cannot start are a failure.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import PY, ROOT, WORKERS, check, clean_env, mldist, results, start_service, stop_service, tail
from mldist.launch.config import CONNECT_TIMEOUT

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "scripts" / "test-hosts.sh"
HOSTS = {"MLDIST_HOSTS": "4"}  # the elastic tests lose hosts of hx1..hx4; the others use hx1 and hx2


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


def test_horovod_run_with_min_np_re_forms_without_the_failed_host(hosts_env: dict[str, str], tmp_path: Path) -> None:
    """horovod.run(fn, hosts=, min_np=2): hx3's worker fails after epoch 2's commit; the function ends on 2."""
    argv = [PY, "-m", "mldist.horovod.alias", str(WORKERS / "hvd_run_elastic.py"), "hx1:1,hx2:1,hx3:1"]
    res = subprocess.run(argv, env=hosts_env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, tail(res)
    assert "lost host hx3 (its worker failed); re-forming the world on hx1,hx2: 2 worker(s)" in res.stderr, tail(res)
    (line,) = [line for line in res.stdout.splitlines() if line.startswith("RESULT ")]
    rows = json.loads(line.split(" ", 1)[1])
    # 2 epochs on 3 (commit 2 kept), 3 more on 2; each rank resumed at epoch 2.
    assert rows == [{"rank": r, "size": 2, "first_epoch": 2, "total": 3 + 3 + 2 + 2 + 2} for r in (0, 1)], rows
    assert not list(tmp_path.glob(".mldist-horovod-run-*")), "the shared task directory is removed"


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


def test_the_jax_guide_forms_one_group_across_hosts(hosts_env: dict[str, str]) -> None:
    """JAX's own jax.distributed.initialize(), no arguments, no mldist import (tests/workers/jax_guide.py)."""
    args = ["run", "-H", "hx1:1,hx2:1", "--no-run-dir", "--", PY, str(WORKERS / "jax_guide.py")]
    res = check(mldist(args, env=hosts_env, timeout=240))
    for rank in (0, 1):
        assert f"[{rank}] {rank} 2 2" in res.stdout and f"[{rank}] [2.]" in res.stdout, tail(res)


def _kill_host(index: int) -> None:
    """Every process of test host hx<index> (its sshd, Open MPI's daemon, the shim, the worker), with SIGKILL."""
    pids = subprocess.run(["ip", "netns", "pids", f"mld-hx{index}"], capture_output=True, text=True).stdout.split()
    assert pids, f"nothing runs on hx{index}"
    subprocess.run(["kill", "-KILL", *pids], check=False)


def _signal_host(index: int, sig: str) -> None:
    """``kill -SIG`` every process of test host hx<index>: STOP leaves its kernel accepting connections that
    no process ever answers (a hung host), CONT lets it go on."""
    pids = subprocess.run(["ip", "netns", "pids", f"mld-hx{index}"], capture_output=True, text=True).stdout.split()
    assert pids, f"nothing runs on hx{index}"
    subprocess.run(["kill", f"-{sig}", *pids], check=False)


def _agent_without(env: dict[str, str], tmp_path: Path, *options: str) -> dict[str, str]:
    """``env`` whose ssh agent reads a copy of the test hosts' ssh config without the lines of ``options``."""
    original = Path(shlex.split(env["PRTE_MCA_plm_ssh_agent"])[-1])
    config = tmp_path / "ssh_config"
    kept = [line for line in original.read_text().splitlines(True) if line.split()[:1] not in [[o] for o in options]]
    config.write_text("".join(kept))
    return {**env, "PRTE_MCA_plm_ssh_agent": f"ssh -F {config}"}


@pytest.mark.parametrize("given", [None, 3])
def test_a_host_that_does_not_answer_is_named_within_the_connect_timeout(
    hosts_env: dict[str, str], tmp_path: Path, given: int | None
) -> None:
    """Every process of hx2 stopped: its kernel accepts ssh's connection and nothing ever answers. The
    agent has no ConnectTimeout of its own (ssh's default), so mpiexec alone would wait for ever."""
    env = _agent_without(hosts_env, tmp_path, "ConnectTimeout")
    flags = [] if given is None else ["--connect-timeout", str(given)]
    args = ["run", "-H", "hx1:1,hx2:1", "--no-run-dir", *flags, "--", PY, "-c", "print('WORKER RAN')"]
    _signal_host(2, "STOP")
    try:
        started = time.monotonic()
        res = mldist(args, env=env, timeout=90)
        took = time.monotonic() - started
    finally:
        _signal_host(2, "CONT")
    limit = CONNECT_TIMEOUT if given is None else given
    print(f"--connect-timeout {limit:g}: hx2 named {took:.1f} s after the start")
    assert res.returncode == 2 and "WORKER RAN" not in res.stdout, tail(res)
    assert res.stderr.strip().splitlines() == [
        f"mldist run: error: host hx2 does not answer over ssh within {limit:g} s; check that it is up, or give it "
        "longer (--connect-timeout)"
    ], tail(res)
    assert limit <= took < limit + 8, f"took {took:.1f} s"


STOPS_ITS_SSHD = (
    "import os, signal, sys, time; rank = int(os.environ['RANK']); "
    "rank == 1 and (os.kill(int(open(sys.argv[1]).read()), signal.SIGSTOP), sys.exit(3)); time.sleep(5)"
)


def test_a_restart_names_a_host_that_stopped_answering(hosts_env: dict[str, str], tmp_path: Path) -> None:
    """--max-restarts 1: rank 1 stops hx2's sshd, then fails. The restart checks the hosts first and names
    hx2 within --connect-timeout, where mpiexec would wait for ever."""
    env = _agent_without(hosts_env, tmp_path, "ConnectTimeout")
    sshd = Path(shlex.split(hosts_env["PRTE_MCA_plm_ssh_agent"])[-1]).parent / "sshd-hx2.pid"
    args = ["run", "-H", "hx1:1,hx2:1", "--max-restarts", "1", "--connect-timeout", "3", "--no-run-dir"]
    try:
        res = mldist([*args, "--", PY, "-c", STOPS_ITS_SSHD, str(sshd)], env=env, timeout=120)
    finally:
        subprocess.run(["kill", "-CONT", sshd.read_text().strip()], check=False)
    assert res.returncode == 1, tail(res)
    assert (
        "mldist run: giving up after 1 restart(s); failures: rank 1 exited with code 3 on hx2; host hx2 does not "
        "answer over ssh within 3 s"
    ) in res.stderr, tail(res)


def test_hosts_that_refuse_the_login_are_named_before_the_start(hosts_env: dict[str, str], tmp_path: Path) -> None:
    """No key for the hosts (mpiexec would report a lost daemon): the line says that they refuse the login."""
    env = _agent_without(hosts_env, tmp_path, "IdentityFile")
    res = mldist(["run", "-H", "hx1:1,hx2:1", "--no-run-dir", "--", PY, "-c", "print('WORKER RAN')"], env=env)
    assert res.returncode == 2 and "WORKER RAN" not in res.stdout, tail(res)
    (line,) = res.stderr.strip().splitlines()
    assert re.fullmatch(r"mldist run: error: host hx[12]: it refuses the login .*Permission denied.*"
                        r"; hx[12] failed the check too", line), line  # fmt: skip


def _kill_daemon(index: int) -> None:
    """Open MPI's daemon on test host hx<index> (the prted that prted forked), with SIGKILL: mpiexec loses its
    connection there (its "lost communication with a remote daemon" report) while ssh and sshd stay up."""
    pids = subprocess.run(["ip", "netns", "pids", f"mld-hx{index}"], capture_output=True, text=True).stdout.split()
    comm = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid in pids if Path(f"/proc/{pid}").exists()}
    parent = {pid: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] for pid in comm}
    daemons = [pid for pid, name in comm.items() if name == "prted" and comm.get(parent[pid]) == "prted"]
    assert daemons, f"no forked prted on hx{index}: {comm}"
    subprocess.run(["kill", "-KILL", *daemons], check=False)


def test_a_host_lost_mid_run_is_named_and_the_output_stays_text(hosts_env: dict[str, str]) -> None:
    """hx2's Open MPI daemon killed while the workers run: mpiexec's report (a help text that ends with a NUL
    byte) reaches the terminal without the NUL, and the run names the lost host."""
    worker = "import time; print('UP', flush=True); time.sleep(60)"
    argv = [PY, "-m", "mldist", "run", "-H", "hx1:1,hx2:1", "--no-run-dir", "--", PY, "-c", worker]
    proc = subprocess.Popen(argv, env=hosts_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        seen = [proc.stdout.readline() for _ in range(2)]
        assert all(line.endswith(b"UP\n") for line in seen), seen
        _kill_daemon(2)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    text = (err + out).decode(errors="replace")
    assert proc.returncode == 1, text
    assert "PRTE has lost communication with a remote daemon" in text, text  # the report that ends with a NUL
    assert b"\0" not in out + err, text
    assert "mldist run: lost host hx2 (mpiexec lost its daemon there); stopping the other workers" in text, text


def _revive_host(index: int) -> None:
    """hx<index> up again (its namespace and sshd), the other hosts untouched."""
    res = subprocess.run(["bash", str(SCRIPT), "revive", str(index)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


Event = tuple[str, Any]
Lines = list[tuple[float, str]]


def _watch(
    argv: list[str], env: dict[str, str], events: list[Event], limit: float = 900, lines: Lines | None = None
) -> tuple[int, Lines]:
    """Run ``argv``; at the first line holding each event's text (in order) call its action; every line
    with the time it came, and ``TEST: <text>`` lines where an action ran (into ``lines`` when given: the
    actions may read what came so far). A run still going after ``limit`` seconds is killed (its code then
    says so: -9)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = [] if lines is None else lines
    assert proc.stdout is not None
    pending = list(events)
    watchdog = threading.Timer(limit, proc.kill)
    watchdog.start()
    try:
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))
            if pending and pending[0][0] in line:
                text, action = pending.pop(0)
                action()
                lines.append((time.monotonic(), f"TEST: {text}"))
        return proc.wait(timeout=60), lines
    finally:
        watchdog.cancel()


def _run_ref(worker: Path, out: Path, hosts: str, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    argv = [PY, "-m", "mldist", "run", "-H", hosts, "--no-run-dir", "--", PY, str(worker), str(out), "reference"]
    return subprocess.Popen([*argv, *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _finish(procs: list[subprocess.Popen[str]]) -> list[str]:
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
    return outs


def _close(got: Any, want: Any) -> bool:
    return bool(np.linalg.norm(np.asarray(got) - np.asarray(want)) / np.linalg.norm(want) < 1e-5)


#: The line after which each API's references can start: the 3-host world has resumed (hvd.elastic's reset
#: callback wrote its state before rank 0's epoch line; mldist.keras.Elastic names its commit on stderr).
JOINED = {"hvd": "BEGIN 3", "keras": "; 3 worker(s)"}
Finish = Callable[[Lines], None]


@pytest.mark.parametrize("api", ["hvd", "keras"])
def test_a_lost_host_leaves_the_world_and_joins_it_again(hosts_env: dict[str, str], tmp_path: Path, api: str) -> None:
    """3 hosts from a discovery script; every process of hx3 killed during epoch 2: the world goes on with 2
    workers from the last commit; hx3 back: it joins at the next commit, and the run ends with 3. Each
    2- and 3-host stretch goes where a fixed world from the same commit goes. Horovod's hvd.elastic
    (elastic_fit.py) and mldist's own mldist.keras.Elastic (elastic_keras.py)."""
    worker = WORKERS / ("elastic_fit.py" if api == "hvd" else "elastic_keras.py")
    elastic = tmp_path / "elastic"
    elastic.mkdir()
    listed, discover = tmp_path / "hosts", tmp_path / "discover.sh"
    listed.write_text("hx1:1\nhx2:1\nhx3:1\n")
    discover.write_text(f"#!/bin/sh\ncat {listed}\n")
    discover.chmod(0o755)
    args = ["--host-discovery-script", str(discover), "--min-np", "2", "--max-np", "3"]
    argv = [PY, "-m", "mldist", "run", *args, "--run-dir", str(elastic / "run"), "--", PY, str(worker), str(elastic)]
    lines: Lines = []
    refs: list[tuple[list[subprocess.Popen[str]], Finish]] = []

    def start_references() -> None:
        """The fixed worlds start once the 3-host world has resumed: they train while the elastic run ends."""
        killed = next(t for t, line in lines if line == "TEST: EPOCH 2 BEGIN 3")
        start = _start_hvd_refs if api == "hvd" else _start_keras_refs
        refs.append(start(worker, lines, killed, elastic, tmp_path, hosts_env))

    events = [
        ("EPOCH 2 BEGIN 3", lambda: _kill_host(3)),
        ("EPOCH 2 BEGIN 2", lambda: _revive_host(3)),
        (JOINED[api], lambda: _deferred(start_references, refs)),
    ]
    try:
        code, lines = _watch(argv, hosts_env, events, lines=lines)
    finally:
        start_service(SCRIPT, "network namespaces, a bridge, sshd", "MLDIST_TEST_SSH_CONFIG", HOSTS)
    try:
        text = "\n".join(line for _, line in lines)
        assert code == 0, text[-5000:]
        killed = next(t for t, line in lines if line == "TEST: EPOCH 2 BEGIN 3")
        resumed = next(t for t, line in lines if t > killed and "FIRST STEP" in line)
        print(f"{api}: from the kill of hx3 to the first step on 2 hosts: {resumed - killed:.1f} s")
        for said in (
            "lost host hx3 (does not answer over ssh); re-forming the world on hx1,hx2: 2 worker(s) (--min-np 2)",
            "host(s) hx3 can join: the workers leave at their next commit to re-form",
            "host(s) hx3 joined; re-forming the world on hx1,hx2,hx3: 3 worker(s) (--max-np 3)",
            "EPOCH 5 BEGIN 3",
            "DONE 0 3",
        ):
            assert said in text, f"{said!r} not in:\n{text[-5000:]}"
        assert re.search(r"mldist run: training again [0-9.]+ s after losing hx3 \(2 worker\(s\)\)", text), text
        shrink, join = json.loads((elastic / "run" / "summary.json").read_text())["elastic"]["reforms"]
        assert (shrink["lost"], shrink["before"], shrink["after"]) == (["hx3"], 3, 2), shrink
        assert (join["joined"], join["before"], join["after"]) == (["hx3"], 2, 3), join
        assert 0 < shrink["loss_to_resume_s"] < 120 and 0 < join["loss_to_resume_s"] < 120
        print(f"{api}: from leaving at a commit for hx3 to resuming with it: {join['loss_to_resume_s']:.1f} s")
        assert len(refs) == 1, f"the references did not start after {JOINED[api]!r}"
        refs[0][1](lines)
    finally:
        for procs, _ in refs:
            for proc in procs:
                proc.kill()  # nothing once they have ended


def _deferred(start: Callable[[], None], refs: list[Any]) -> None:
    """``start()``; a failure there is the test's failure, but only after the run it watches has ended."""
    try:
        start()
    except Exception as exc:  # raised again by the finish, once the run has ended
        failure = exc

        def fail(_: Lines) -> None:
            raise failure

        refs.append(([], fail))


def _start_hvd_refs(
    worker: Path, lines: Lines, killed: float, elastic: Path, tmp: Path, env: dict[str, str]
) -> tuple[list[subprocess.Popen[str]], Finish]:
    """hvd.elastic: it resumed from the last commit before the kill; from each resumed state (the reset
    callback's), a fixed world of that size goes where the elastic one went. Starts the fixed worlds; the
    check runs once the elastic run has ended."""
    commits = [line.split() for t, line in lines if t < killed and line.startswith("[0] COMMIT")]
    first, second = (pickle.loads((elastic / f"resumed-{n}.pkl").read_bytes()) for n in (1, 2))
    assert commits and first["values"]["epoch"] == int(commits[-1][3]), commits
    until = str(second["values"]["epoch"])
    two, three = tmp / "ref2", tmp / "ref3"
    two.mkdir(), three.mkdir()
    procs = [
        _run_ref(worker, two, "hx1:1,hx2:1", env, str(elastic / "resumed-1.pkl"), until),
        _run_ref(worker, three, "hx1:1,hx2:1,hx3:1", env, str(elastic / "resumed-2.pkl")),
    ]

    def finish(_: Lines) -> None:
        _finish(procs)
        assert _close(np.load(two / "final.npy"), np.concatenate([w.ravel() for w in second["variables"][:4]]))
        assert _close(np.load(elastic / "final.npy"), np.load(three / "final.npy"))

    return procs, finish


def _start_keras_refs(
    worker: Path, lines: Lines, killed: float, elastic: Path, tmp: Path, env: dict[str, str]
) -> tuple[list[subprocess.Popen[str]], Finish]:
    """mldist.keras.Elastic: both resumes read a host's memory copy; from rank 0's commits on disk (up to the
    resumed one) a fixed world of that size goes where the elastic one went; the rate is scale_lr's for each
    size. Starts the fixed worlds; the check runs once the elastic run has ended."""

    def resumes(seen: Lines) -> list[tuple[int, str]]:
        found = [re.search(r"resumed: step ([0-9]+) from (\S+);", line) for t, line in seen if t > killed]
        return [(int(m.group(1)), m.group(2)) for m in found if m]

    (s1, h1), (s2, h2) = resumes(lines)
    assert {h1, h2} <= {"hx1", "hx2"}, (h1, h2)  # memory, not the disk
    disk = elastic / "run" / "elastic"
    second = next(p for p in disk.glob("ckpt-*") if int(p.name.split("-")[1]) == s2)
    epoch2 = json.loads((second / "manifest.json").read_text())["extra"]["epoch"]
    for name, step in (("ref2", s1), ("ref3", s2)):
        # Only the commits up to the resumed one: the elastic run may still be writing newer ones.
        newer = lambda folder, names, step=step: [  # noqa: E731
            n for n in names if folder == str(disk) and not (n.startswith("ckpt-") and int(n.split("-")[1]) <= step)
        ]
        shutil.copytree(disk, tmp / name / "elastic", ignore=newer)
    procs = [
        _run_ref(worker, tmp / "ref2", "hx1:1,hx2:1", env, str(epoch2)),
        _run_ref(worker, tmp / "ref3", "hx1:1,hx2:1,hx3:1", env),
    ]

    def finish(seen: Lines) -> None:
        two_out, three_out = _finish(procs)
        assert resumes(seen) == [(s1, h1), (s2, h2)], resumes(seen)  # no other resume after these two
        with np.load(second / "state.npz") as state:
            committed = np.concatenate([state[f"model.{i}"].ravel() for i in range(4)])
        assert _close(np.load(tmp / "ref2" / "final.npy"), committed)
        assert _close(np.load(elastic / "final.npy"), np.load(tmp / "ref3" / "final.npy"))
        text = "\n".join(line for _, line in seen)
        assert "[0] LR 0.06" in text and "[0] LR 0.04" in two_out and "[0] LR 0.06" in three_out

    return procs, finish


def _short_elastic_run(env: dict[str, str], out: Path, events: list[Event]) -> tuple[int, list[tuple[float, str]], str]:
    """elastic_fit.py (hvd.elastic) for 4 epochs on hx1..hx4, --min-np 2, without a discovery script;
    ``events`` as in :func:`_watch`; its code, lines and text. A hung run ends after 240 s."""
    out.mkdir()
    args = ["run", "-H", "hx1:1,hx2:1,hx3:1,hx4:1", "--min-np", "2", "--max-np", "4", "--run-dir", str(out / "run")]
    worker = [PY, str(WORKERS / "elastic_fit.py"), str(out), "elastic", "-", "4"]
    code, lines = _watch([PY, "-m", "mldist", *args, "--", *worker], env, events, limit=240)
    return code, lines, "\n".join(line for _, line in lines)


def test_losing_rank_0_s_host_then_a_frozen_host_re_forms_the_world_each_time(
    hosts_env: dict[str, str], tmp_path: Path
) -> None:
    """One elastic run on hx1..hx4 (--min-np 2) that loses two hosts, one after the other:

    - every process of hx1 (rank 0's host: its worker, Open MPI's daemon, sshd) killed in epoch 1: the world
      re-forms on hx2, hx3 and hx4 (rank 0 now on hx2) from the last commit;
    - every process of hx3 stopped in epoch 2 of that world (``test-hosts.sh freeze 3``; sshd too: no
      connection closes, nothing answers). ssh's keepalives end mpiexec's session there, the round ends
      without waiting for hx3's daemon, the probe names hx3 within its bound, and the world re-forms on hx2
      and hx4 from the re-formed world's last commit and finishes there.

    (One run for both: each loss its own run paid the start and the first epochs again.)"""
    out = tmp_path / "out"
    freeze = lambda: subprocess.run(["bash", str(SCRIPT), "freeze", "3"], check=True, timeout=30)  # noqa: E731
    events = [("EPOCH 1 BEGIN 4", lambda: _kill_host(1)), ("EPOCH 2 BEGIN 3", freeze)]
    try:
        code, lines, text = _short_elastic_run(hosts_env, out, events)
    finally:
        subprocess.run(["bash", str(SCRIPT), "thaw", "3"], timeout=30, check=False)
        for host in (1, 3):
            _revive_host(host)
    assert code == 0, text[-5000:]
    hits = [t for t, line in lines if line.startswith("TEST: ")]
    assert len(hits) == 2, text[-5000:]
    resumed = [next(t for t, line in lines if t > hit and "FIRST STEP" in line) for hit in hits]
    print(f"hx1 killed to the first step on hx2,hx3,hx4: {resumed[0] - hits[0]:.1f} s")
    print(f"hx3 frozen to the first step on hx2,hx4: {resumed[1] - hits[1]:.1f} s")
    # The keepalives ended mpiexec's session to hx3: Open MPI's notice for it, in mldist's words.
    assert "mldist run: lost host hx3 (it stopped answering: down, or its link cut;" in text, text[-5000:]
    assert "firewall" not in text, text[-5000:]
    assert resumed[1] - hits[1] < 60, text[-5000:]

    # Each loss re-formed the world on the hosts left, from the last commit before it.
    for lost, hosts, n in (("hx1", "hx2,hx3,hx4", 3), ("hx3", "hx2,hx4", 2)):
        assert re.search(rf"mldist run: lost host {lost} \(does not answer over ssh\); re-forming the world on "
                         rf"{hosts}: {n} worker\(s\) \(--min-np 2\)", text), text[-5000:]  # fmt: skip
    assert "EPOCH 3 BEGIN 2" in text and "[0] DONE 0 2" in text and "[1] DONE 1 2" in text, text[-5000:]
    reforms = json.loads((out / "run" / "summary.json").read_text())["elastic"]["reforms"]
    assert [(r["lost"], r["before"], r["after"]) for r in reforms] == [(["hx1"], 4, 3), (["hx3"], 3, 2)], reforms
    for round_, hit in enumerate(hits, 1):
        commits = [line.split() for t, line in lines if t < hit and line.startswith("[0] COMMIT")]
        state = pickle.loads((out / f"resumed-{round_}.pkl").read_bytes())
        assert commits and state["values"]["epoch"] == int(commits[-1][3]), (round_, commits)
    # Both workers of the 2-host world ended with the same weights.
    ranks = [np.load(out / f"final-{rank}.npy") for rank in (0, 1)]
    assert np.array_equal(ranks[0], ranks[1]) and np.isfinite(ranks[0]).all()


def _cut(index: int, cut: bool) -> None:
    """hx<index>'s link cut (or healed) at the bridge, as a dead switch port cuts it: every frame to and from
    it is dropped in both directions, its link stays up and its processes live and see no error. (tc's drop
    action is not in this kernel; a pfifo of limit 0 on its own side would fail its sends at once instead.)"""
    state = "0" if cut else "3"  # disabled / forwarding
    subprocess.run(["bridge", "link", "set", "dev", f"mld-hx{index}-h", "state", state], check=True, timeout=30)


def _run_processes(index: int, mark: str) -> list[str]:
    """The command lines of this run's processes on hx<index>: the shims and workers whose command holds
    ``mark`` (other tests' runs may use the host too)."""
    pids = subprocess.run(["ip", "netns", "pids", f"mld-hx{index}"], capture_output=True, text=True).stdout.split()
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if mark in line:
                found.append(line)
    return found


def test_a_partitioned_host_is_left_out_and_its_side_stops_without_writing_what_the_others_read(
    hosts_env: dict[str, str], tmp_path: Path
) -> None:
    """mldist.keras.Elastic on hx1..hx3 (--min-np 2); in epoch 2 hx1's link is cut (rank 0's host: its
    worker believes it is rank 0, alive and cut off). The run says so in mldist's line, not in Open MPI's
    firewall notice, and re-forms on hx2 and hx3. The cut-off side's shim and worker stop within the
    collective timeout, and sooner: at the next round's fence (remote_shim reads the round from the run
    directory, which hx1 still sees), before the new world trains. After the link is healed: nothing of the
    run is left on hx1, every checkpoint after the resumed one was written by the 2-worker world, and no
    file of the run directory that the survivors read (node records, stall verdicts) is from hx1's side."""
    out, timeout = tmp_path / "out", 120
    out.mkdir()
    env = {**hosts_env, "MLDIST_COLLECTIVE_TIMEOUT": str(timeout)}
    args = ["run", "-H", "hx1:1,hx2:1,hx3:1", "--min-np", "2", "--max-np", "3", "--run-dir", str(out / "run")]
    argv = [PY, "-m", "mldist", *args, "--", PY, str(WORKERS / "elastic_keras.py"), str(out), "elastic", "5"]
    seen: list[tuple[float, list[str]]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.5):
            seen.append((time.monotonic(), _run_processes(1, str(out))))

    def cut() -> None:
        _cut(1, True)
        threading.Thread(target=watch, daemon=True).start()

    clock = time.time() - time.monotonic()  # wall-clock time of a monotonic reading, for file times
    try:
        code, lines = _watch(argv, env, [("EPOCH 2 BEGIN 3", cut)], limit=300)
    finally:
        stop.set()
        _cut(1, False)
    time.sleep(5)  # healed: whatever the cut-off side still had to say could arrive now
    text = "\n".join(line for _, line in lines)
    assert code == 0, text[-5000:]
    assert "firewall" not in text and "A daemon failed" not in text, text[-5000:]
    assert ("mldist run: lost host hx1 (it stopped answering: down, or its link cut; Open MPI's daemon there did not "
            "report back); stopping the other workers") in text, text[-5000:]  # fmt: skip
    assert "re-forming the world on hx2,hx3: 2 worker(s) (--min-np 2)" in text, text[-5000:]
    assert "[0] DONE 0 2" in text and "[1] DONE 1 2" in text, text[-5000:]
    cut_at = next(t for t, line in lines if line == "TEST: EPOCH 2 BEGIN 3")
    reformed = next(t for t, line in lines if "re-forming the world on" in line)
    gone = next((t for t, procs in seen if not procs), None)
    assert gone is not None, seen[-1:]
    print(f"hx1 cut: re-formed after {reformed - cut_at:.1f} s, its shim and worker gone after {gone - cut_at:.1f} s")
    resumed_at = next(t for t, line in lines if "training again" in line)
    assert gone - cut_at < timeout and gone < resumed_at, f"the cut-off side ran {gone - cut_at:.1f} s\n{text}"
    assert not _run_processes(1, str(out)), _run_processes(1, str(out))
    # No split brain: the 2-worker world's checkpoints follow the one it resumed from; the cut-off rank 0 wrote
    # none, and nothing it wrote in the progress folder is there for the survivors to read.
    resumed = int(re.search(r"resumed: step ([0-9]+) from hx[23]; 2 worker\(s\)", text).group(1))  # type: ignore[union-attr]
    sizes = {int(p.name.split("-")[1]): json.loads((p / "manifest.json").read_text())["extra"]["size"]
             for p in (out / "run" / "elastic").glob("ckpt-*")}  # fmt: skip
    assert all(size == (3 if step <= resumed else 2) for step, size in sizes.items()), sizes
    assert max(sizes) > resumed, sizes
    progress = out / "run" / "progress"
    assert not (progress / "node-hx1.rec").exists() and not list(progress.glob("stall-*")), sorted(progress.iterdir())
    files = [p for p in (out / "run").rglob("*") if p.is_file() and "hx1" in p.name]
    late = [p for p in files if p.stat().st_mtime > clock + reformed]
    assert not late, late


#: A worker that prints a few lines from every rank (each rank's log is written) and stays a while.
PRINTS = "import time; [print('LINE', i, flush=True) for i in range(3)]; print('UP', flush=True); time.sleep(8)"


def _launcher_files(hosts: str, ranks: int, env: dict[str, str], run_dir: Path) -> int:
    """The most descriptors ``mldist run -H hosts`` held while all ``ranks`` ranks ran (/proc/PID/fd)."""
    argv = [PY, "-m", "mldist", "run", "-H", hosts, "--run-dir", str(run_dir), "--", PY, "-c", PRINTS]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    most, up, seen = 0, 0, []
    for line in proc.stdout:
        seen.append(line)
        up += line.rstrip().endswith("] UP")
        if up == ranks:
            for _ in range(10):  # the ranks sleep: what the launcher holds while they run
                most = max(most, len(list(Path(f"/proc/{proc.pid}/fd").iterdir())))
                time.sleep(0.2)
            break
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and up == ranks, "".join(seen) + out
    assert all((run_dir / f"rank-{r}.log").read_text().count("LINE") == 3 for r in range(ranks))
    return most


def test_the_launcher_s_open_files_grow_with_hosts_not_ranks(hosts_env: dict[str, str], tmp_path: Path) -> None:
    """4 hosts x 2 ranks, then x 4: the launcher holds as many files for 16 ranks as for 8 (before: one more
    rank log each). Remote ranks' output comes through mpiexec's two pipes; the rank logs open are at most
    one per host (at least 8). Open MPI's own tree spawn is used (routed radix 2: hx1's and hx2's daemons
    start hx3's and hx4's over the same ssh agent)."""
    env = {**hosts_env, "PRTE_MCA_routed_radix": "2"}
    two = _launcher_files("hx1:2,hx2:2,hx3:2,hx4:2", 8, env, tmp_path / "two")
    four = _launcher_files("hx1:4,hx2:4,hx3:4,hx4:4", 16, env, tmp_path / "four")
    print(f"launcher's open files over 4 test hosts: {two} with 2 ranks a host, {four} with 4")
    assert four <= two + 1, (two, four)
