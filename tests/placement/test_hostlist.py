"""Slurm host lists and tasks-per-node strings (``mldist.placement.hostlist``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mldist.errors import ConfigError, DetectionError, LaunchError
from mldist.launch.elastic import parse_discovered
from mldist.launch.hosts import parse_hosts, read_hostfile
from mldist.launch.hosts import read_nodefile as hosts_read_nodefile
from mldist.placement.allocation import read_nodefile
from mldist.placement.detect import detect
from mldist.placement.hostlist import expand_hostlist, expand_tasks_per_node, host_entry


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
        ("n[9-11],login1", ["n9", "n10", "n11", "login1"]),
        ("node1,node2", ["node1", "node2"]),
        ("r[1-2]n[0-1]", ["r1n0", "r1n1", "r2n0", "r2n1"]),
        ("x3005c0s13b0n0", ["x3005c0s13b0n0"]),
        ("a[008-010]", ["a008", "a009", "a010"]),
    ],
)
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["gpu[01-04", "gpu]1[", "n[a-b]", "n[5-3]"])
def test_bad_hostlists_are_named(text: str) -> None:
    with pytest.raises(DetectionError, match="host list"):
        expand_hostlist(text)


def test_tasks_per_node() -> None:
    assert expand_tasks_per_node("3(x2),2") == [3, 3, 2]
    assert expand_tasks_per_node("1") == [1]
    with pytest.raises(DetectionError, match="tasks-per-node"):
        expand_tasks_per_node("3(2)")


@pytest.mark.parametrize(
    ("text", "hostfile", "entry"),
    [
        ("node1", False, ("node1", None)),
        ("node1:2", False, ("node1", 2)),
        ("n-1.hsn:16", False, ("n-1.hsn", 16)),
        ("node1 slots=4", True, ("node1", 4)),
        ("node1 slots=4", False, None),
        ("node1:2:3", False, None),
        ("node1:12345", False, None),
        ("hx1; rm -rf /", True, None),
        ("", False, None),
    ],
)
def test_one_grammar_reads_an_entry_of_every_host_list(text: str, hostfile: bool, entry: object) -> None:
    assert host_entry(text, hostfile=hostfile) == entry


def test_minus_h_a_hostfile_and_a_discovery_script_read_hosts_alike(tmp_path: Path) -> None:
    """The three readers of host lists (-H, --hostfile, --host-discovery-script) over the one grammar."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1:2\nnode-2.hsn\n")
    want = (("node1", 2), ("node-2.hsn", 1))
    assert parse_hosts("node1:2,node-2.hsn") == read_hostfile(str(hostfile)) == want
    assert parse_discovered("node1:2\nnode-2.hsn\n", 1) == want
    for bad in ("node1:2:3", "a;b"):
        hostfile.write_text(bad + "\n")
        with pytest.raises(ConfigError):
            parse_hosts(bad)
        with pytest.raises(ConfigError):
            read_hostfile(str(hostfile))
        with pytest.raises(LaunchError):
            parse_discovered(bad, 1)


def test_one_reader_of_pbs_node_files(tmp_path: Path) -> None:
    """mldist run's hosts under PBS and a PBS rank's placement read the node file one way."""
    path = tmp_path / "nodefile"
    path.write_text("x1.hsn\nx1.hsn\n\nx2.hsn\n")
    assert read_nodefile(str(path)) == (("x1.hsn", 2), ("x2.hsn", 1)) == hosts_read_nodefile(str(path))
    assert detect({"PBS_JOBID": "7.pbs", "PBS_NODEFILE": str(path)}).hosts == ("x1.hsn",)
    with pytest.raises(OSError):
        read_nodefile(str(tmp_path / "missing"))
    with pytest.raises(DetectionError, match=r"PBS_NODEFILE=.* cannot be read"):
        detect({"PBS_JOBID": "7.pbs", "PBS_NODEFILE": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match=r"PBS node file .*; use --local"):
        hosts_read_nodefile(str(tmp_path / "missing"))
