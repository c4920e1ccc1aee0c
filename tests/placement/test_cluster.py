"""Host discovery and port assignment."""

from __future__ import annotations

import json
import socket
from itertools import combinations

import pytest

from mldist.errors import ConfigError, DetectionError, LaunchError
from mldist.placement.cluster import assign_ports, build_cluster_spec, port_base
from mldist.placement.detect import Placement, detect
from mldist.runtime.engines.tf_engine import check_port_free


def test_emulated_nodes_sharing_an_address_get_distinct_ports() -> None:
    # Two emulated Slurm nodes on 127.0.0.1: both resolve to one address.
    env = {
        "SLURM_JOB_ID": "12",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NODELIST": "node[1-2]",
    }
    env["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)"
    specs = []
    for rank in range(4):
        node, local = divmod(rank, 2)
        e = dict(env, SLURM_PROCID=str(rank), SLURM_NODEID=str(node), SLURM_LOCALID=str(local))
        specs.append(build_cluster_spec(detect(e), {}))
    assert len({s.workers for s in specs}) == 1
    workers = specs[0].workers
    assert [w.split(":")[0] for w in workers] == ["node1", "node1", "node2", "node2"]
    assert len({w.split(":")[1] for w in workers}) == 4


def test_concurrent_steps_and_adjacent_jobs_never_collide() -> None:
    keys = ["100.0", "100.1", "101.0", "102.0", "103.5", "abc", "x.y"]
    blocks = {k: set(assign_ports(k, 8, 20000)) for k in keys}
    for a, b in combinations(keys[:5], 2):
        assert not blocks[a] & blocks[b], (a, b)
    for ports in blocks.values():
        assert all(20000 <= p < 32000 for p in ports)


def test_port_base_override_and_errors() -> None:
    assert port_base({"MLDIST_PORT_BASE": "30000"}) == 30000
    for bad in ("abc", "80", "65000"):
        with pytest.raises(ConfigError, match=f"MLDIST_PORT_BASE='{bad}'"):
            port_base({"MLDIST_PORT_BASE": bad})


def test_mpi_launcher_without_hosts_uses_discovery() -> None:
    p = Placement("openmpi", rank=1, size=2, job_key="9")
    spec = build_cluster_spec(p, {}, discover=lambda me: ["hostA", "hostB"])
    assert [w.split(":")[0] for w in spec.workers] == ["hostA", "hostB"]
    assert json.loads(spec.tf_config())["task"] == {"type": "worker", "index": 1}


def test_discovery_without_mpi4py_says_what_to_pass() -> None:
    def missing(_: str) -> list[str]:
        raise DetectionError("install mpi4py or set MLDIST_WORKERS")

    with pytest.raises(DetectionError, match="MLDIST_WORKERS"):
        build_cluster_spec(Placement("mpich", rank=0, size=2), {}, discover=missing)


def test_explicit_workers_win_and_are_checked() -> None:
    p = Placement("openmpi", rank=0, size=2)
    spec = build_cluster_spec(p, {"MLDIST_WORKERS": "a:1,b:2"})
    assert spec.workers == ("a:1", "b:2")
    with pytest.raises(ConfigError, match="3 addresses"):
        build_cluster_spec(p, {"MLDIST_WORKERS": "a:1,b:2,c:3"})
    with pytest.raises(ConfigError, match="'b' is not host:port"):
        build_cluster_spec(p, {"MLDIST_WORKERS": "a:1,b"})


def test_a_taken_port_is_named() -> None:
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {port} "):
            check_port_free(f"localhost:{port}")
