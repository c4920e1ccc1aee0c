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
