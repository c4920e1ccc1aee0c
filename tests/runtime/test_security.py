"""No worker port accepts TensorFlow RPCs from outside: with the MPI engine there is no server, with RING
the workers sit in a private network namespace; with RING on the host's network they do (the control)."""

from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import PY, WORKERS, clean_env

pytestmark = pytest.mark.slow

WAITER = (
    "import os, time, mldist; ctx = mldist.init(); "
    "print('READY', ctx.rank, ctx.communication, os.getpid(), flush=True); time.sleep(300)"
)


def listening_ports(pid: int) -> set[int]:
    """TCP ports (IPv4 and IPv6) on which process ``pid`` holds a listening socket, in its own network namespace."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in (f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def _ready(proc: subprocess.Popen[str], n: int, timeout: float = 120) -> list[tuple[int, str, int]]:
    rows: list[tuple[int, str, int]] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while len(rows) < n and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if "READY " in line:  # "[R] READY rank engine pid"
            rank, engine, pid = line.split("READY ", 1)[1].split()[:3]
            rows.append((int(rank), engine, int(pid)))
    return rows


def _attack(port: int, task: int, target: Path) -> str:
    """The client's last line: RAN, REFUSED ..., or TIMEOUT (a port that speaks no gRPC never answers).

    The RING control runs its ops in ~7 s including TensorFlow's import; 30 s is ample.
    """
    try:
        res = subprocess.run(
            [PY, str(WORKERS / "tf_client.py"), str(port), str(task), str(target)],
            capture_output=True, text=True, timeout=30, env=clean_env(),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "TIMEOUT"
    return (res.stdout.strip().splitlines() or ["(no output)"])[-1]


@pytest.mark.parametrize(
    "engine, network, exposed",
    [("mpi", "auto", False), ("ring", "host", True), ("ring", "auto", False)],
    ids=["mpi", "ring-host-network-control", "ring-private-network"],
)
def test_tensorflow_clients_cannot_run_ops_in_workers(engine: str, network: str, exposed: bool, tmp_path: Path) -> None:
    run = ["run", "-n", "2", "--communication", engine, "--network", network]
    argv = [PY, "-m", "mldist", *run, "--", PY, "-c", WAITER]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env())
    try:
        workers = _ready(proc, 2)
        assert [(r, e) for r, e, _ in sorted(workers)] == [(0, engine), (1, engine)], workers
        targets = [(port, rank) for rank, _, pid in workers for port in sorted(listening_ports(pid))]
        if engine == "ring":
            assert targets, "RING workers must listen (TensorFlow's gRPC server), privately or not"
        with ThreadPoolExecutor(max_workers=2) as pool:
            outcomes = list(pool.map(lambda t: _attack(t[0], t[1], tmp_path / f"written-{t[0]}"), targets))
    finally:
        proc.kill()
        proc.wait()
    ran = [f"{port} (rank {rank})" for (port, rank), out in zip(targets, outcomes, strict=True) if out == "RAN"]
    report = f"ports {targets}: {outcomes}"
    if exposed:
        assert ran, f"the control failed: no RING worker port ran the client's ops; {report}"
    else:
        assert not ran, f"TensorFlow ops ran inside {engine} workers through {ran}; {report}"


def _tree(root: int) -> set[int]:
    """``root`` and all its descendants (from /proc's parent links)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    seen, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += parents.get(pid, [])
    return seen


def _host_listeners(pids: set[int]) -> list[str]:
    """``pid:port`` of the listening TCP sockets that ``pids`` hold in this test's (the host's) network."""
    host = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A":
                host[cols[9]] = int(cols[1].rsplit(":", 1)[1], 16)
    found = []
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        found += [f"{pid}:{host[link[8:-1]]}" for link in links if link.startswith("socket:[") and link[8:-1] in host]
    return sorted(found)


@pytest.mark.parametrize("network, exposed", [("auto", False), ("host", True)], ids=["private", "host-control"])
def test_an_mpi_run_on_one_host_listens_on_no_host_interface(network: str, exposed: bool) -> None:
    """Open MPI's launcher binds every interface: mldist run keeps it (and the workers) in a private network."""
    argv = [
        PY,
        "-m",
        "mldist",
        "run",
        "-n",
        "2",
        "--communication",
        "mpi",
        "--network",
        network,
        "--",
        PY,
        "-c",
        WAITER,
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env())
    try:
        workers = _ready(proc, 2)
        assert [(r, e) for r, e, _ in sorted(workers)] == [(0, "mpi"), (1, "mpi")], workers
        listeners = _host_listeners(_tree(proc.pid))
        # Shared memory between the workers: no TCP transport listening, in any namespace.
        in_workers = {rank: listening_ports(pid) for rank, _, pid in workers}
    finally:
        proc.kill()
        proc.wait()
    assert in_workers == {0: set(), 1: set()}, in_workers
    if exposed:
        assert listeners, "the control failed: prterun on the host's network should listen there"
    else:
        assert listeners == [], f"listening on the host's network: {listeners}"
