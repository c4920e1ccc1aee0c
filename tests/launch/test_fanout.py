"""Asking thousands of hosts at once (mldist.launch.fanout, mldist.launch.hosts.silent_hosts).

The silent hosts are names in a network namespace of the test's own (``unshare -n -m``): a hosts file
bound over /etc/hosts maps them to TEST-NET-1 addresses routed into a veth pair whose other end drops
every packet (nothing there has that address, and the namespace forwards nothing). No packet leaves the
namespace. Without root or namespaces these tests skip with the reason; with CI=true that is a failure.
"""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from helpers import PY, ROOT, cannot_here, clean_env, tail
from mldist.launch import fanout
from mldist.launch.hosts import silent_hosts, summary

#: Runs a command where the silent hosts' names drop every packet (see the script).
DROPPING_NET = ROOT / "scripts" / "dropping-net.sh"


def _silent_names(tmp_path: Path, count: int) -> tuple[Path, list[str]]:
    names = [f"s{i:04d}" for i in range(count)]
    hosts = tmp_path / "hosts"
    lines = ["127.0.0.1 localhost"] + [f"192.0.2.{i % 250 + 2} {name}" for i, name in enumerate(names)]
    hosts.write_text("\n".join(lines) + "\n")
    return hosts, names


def _in_dropping_net(hosts: Path, argv: list[str]) -> list[str]:
    """``argv`` run inside a namespace whose names in ``hosts`` drop every packet (skips where it cannot)."""
    wrapped = ["unshare", "-n", "-m", "--", "bash", str(DROPPING_NET), str(hosts), *argv]
    probe = subprocess.run([*wrapped[:-len(argv)], "true"], capture_output=True, text=True, timeout=60)  # fmt: skip
    if probe.returncode != 0:
        cannot_here(f"no namespace with a dropping network here: {probe.stderr.strip()[:200]}")
    return wrapped


def test_the_descriptor_plan_of_4096_hosts_grows_with_hosts_not_ranks() -> None:
    plan = fanout.descriptor_plan(4096, 4)
    assert plan == {"base": 64, "host check": 2048, "mpiexec pipes": 2, "rank logs": 256, "total": 2112}
    assert plan["total"] < 4096
    assert fanout.descriptor_plan(4096, 8)["total"] == plan["total"]  # twice the ranks, the same files
    assert fanout.descriptor_plan(4, 2)["total"] == fanout.descriptor_plan(4, 4)["total"]
    # A low limit narrows the check's window instead of refusing the launch.
    assert fanout.descriptor_plan(4096, 4, soft_limit=1024)["host check"] == 1024 - fanout.RESERVE_FDS


def test_a_4096_host_launch_is_not_refused_for_open_files_under_20000(tmp_path: Path) -> None:
    """Before: "-n 4096 needs about 24640 open files but this shell allows 20000 (ulimit -Hn)"."""
    from mldist.launch.config import ensure_descriptors

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 20000 and os.geteuid() != 0:  # root may raise it
        cannot_here(f"the hard open-file limit here is {hard}, and only root may raise it")
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, 20000))
    try:
        ensure_descriptors(16384, (fanout.descriptor_plan(4096, 4)["total"], 4096))
        from mldist.errors import LaunchError

        with pytest.raises(LaunchError, match=r"^-n 16384 on 4096 hosts needs about 30000 open files but this shell"):
            ensure_descriptors(16384, (30000, 4096))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_tcp_screen_tells_answering_refusing_and_unknown_hosts_apart() -> None:
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections to it are refused
        port, refused = listening.getsockname()[1], closed.getsockname()[1]
        assert fanout.tcp_screen(["127.0.0.1", "localhost"], port, 5, 1) == {}
        assert fanout.tcp_screen(["127.0.0.1"], refused, 5, 8) == {
            "127.0.0.1": f"connect to host 127.0.0.1 port {refused}: Connection refused"
        }
    said = fanout.tcp_screen(["no-such-host.invalid"], 22, 5, 8)
    assert said == {
        "no-such-host.invalid": "ssh: Could not resolve hostname no-such-host.invalid: Name or service not known"
    }


def test_run_all_keeps_its_window_codes_words_and_timeouts() -> None:
    cmd = {"a": "exit 0", "b": "echo nope >&2; exit 3", "c": "sleep 30", "d": "sleep 0.5", "e": "sleep 0.5"}
    started = time.monotonic()
    found = fanout.run_all(list(cmd), lambda h: ["sh", "-c", cmd[h]], os.environ, timeout=1.5, most=2)
    took = time.monotonic() - started
    assert found == {"a": (0, ""), "b": (3, "nope\n"), "c": (None, ""), "d": (0, ""), "e": (0, "")}
    assert list(found) == list(cmd)
    # 2 at a time: c holds a slot for its 1.5 s, d and e take turns in the other.
    assert 1.4 < took < 10, took
    missing = fanout.run_all(["x"], lambda h: ["/nonexistent/ssh", h], os.environ, timeout=5)
    assert missing["x"][0] is None and missing["x"][1].startswith(fanout.NOT_STARTED), missing


def test_a_line_for_thousands_of_silent_hosts_stays_short() -> None:
    silent = {f"s{i:04d}": f"host s{i:04d} does not answer over ssh within 2 s; check it" for i in range(4096)}
    line = summary(silent)
    assert len(line) < 200, line
    assert line.endswith("; 4095 more of 4096 hosts failed the check too (s0001, s0002, s0003, s0004, s0005, ...)")


def test_direct_port_reads_ssh_config_and_stops_at_a_proxy(tmp_path: Path) -> None:
    if shutil.which("ssh") is None:
        cannot_here("no ssh client here (apt-get install openssh-client)")
    config = tmp_path / "ssh_config"
    config.write_text("Host far*\n  ProxyJump gate\nHost alias1\n  HostName 127.0.0.1\nHost *\n  Port 2222\n")
    agent = ["ssh", "-F", str(config)]
    assert fanout.direct_port(agent, [f"n{i}" for i in range(40)], os.environ) == 2222
    assert fanout.direct_port(agent, ["n1", "far2"], os.environ) is None
    assert fanout.direct_port(agent, ["n1", "alias1"], os.environ) is None
    assert fanout.direct_port(["/site/bin/launch"], ["n1"], os.environ) is None


@pytest.mark.slow
def test_4096_silent_hosts_are_named_in_one_line_within_twice_the_connect_timeout(tmp_path: Path) -> None:
    """``mldist run -H <4,096 silent one-slot hosts> --connect-timeout 2`` under ``ulimit -n 20000``: exit 2,
    one short line, within 2 x 2 s + 5 s. (Before: refused for 24,640 open files; with the limit raised,
    the check ran 64 ssh at a time, in 64 waves of 4 s: over 4 minutes.)"""
    hosts, names = _silent_names(tmp_path, 4096)
    run = [PY, "-m", "mldist", "run", "-H", ",".join(f"{n}:1" for n in names), "--connect-timeout", "2"]
    run += ["--no-run-dir", "--", PY, "-c", "print('WORKER RAN')"]
    argv = _in_dropping_net(hosts, ["bash", "-c", 'ulimit -n 20000 && exec "$@"', "-", *run])
    env = clean_env(PRTE_MCA_plm_ssh_agent="ssh -F /dev/null -o StrictHostKeyChecking=no")
    started = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    took = time.monotonic() - started
    print(f"4096 silent hosts, --connect-timeout 2: named in {took:.1f} s")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and "WORKER RAN" not in res.stdout, tail(res)
    assert lines == [
        "mldist run: error: host s0000 does not answer over ssh within 2 s; check that it is up, or give it longer "
        "(--connect-timeout); 4095 more of 4096 hosts failed the check too (s0001, s0002, s0003, s0004, s0005, ...)"
    ], tail(res)
    assert took < 2 * 2 + 5, f"took {took:.1f} s"


@pytest.mark.slow
def test_silent_hosts_beside_answering_ones_cost_one_connect_timeout(tmp_path: Path) -> None:
    """300 silent names and this namespace's own sshd-less loopback (refused): every one named, the silent
    ones as silent, in about one timeout (the ssh step has nothing left to ask)."""
    hosts, names = _silent_names(tmp_path, 300)
    code = (
        "import json, os, sys, time; from mldist.launch.hosts import silent_hosts; t = time.monotonic(); "
        "s = silent_hosts(sys.argv[1:], os.environ, 3); print(json.dumps([time.monotonic() - t, s]))"
    )
    argv = _in_dropping_net(hosts, [PY, "-c", code, *names, "localhost"])
    env = clean_env(PRTE_MCA_plm_ssh_agent="ssh -F /dev/null")
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, tail(res)
    import json

    took, silent = json.loads(res.stdout)
    assert list(silent) == [*names, "localhost"]
    assert all("does not answer over ssh within 3 s" in silent[n] for n in names)
    assert "nothing listens for ssh there" in silent["localhost"], silent["localhost"]
    assert 3 <= took < 3 + 5, took


def test_silent_hosts_names_a_missing_ssh_in_words() -> None:
    said = silent_hosts(["n1"], {"PRTE_MCA_plm_ssh_agent": "/nonexistent/ssh"}, 2)
    assert said == {"n1": "host n1: ssh does not run (/nonexistent/ssh: No such file or directory); set "
                           "PRTE_MCA_plm_ssh_agent"}  # fmt: skip


def test_growing_the_world_asks_only_the_new_hosts(tmp_path: Path) -> None:
    """The round's own hosts just left together at a commit: known good, not asked again (before: all)."""
    from mldist.launch.config import ElasticConfig, RunConfig
    from mldist.launch.elastic import grow

    agent, log, listed = tmp_path / "agent", tmp_path / "asked", tmp_path / "discover"
    agent.write_text(f'#!/bin/sh\nfor a in "$@"; do prev="$host"; host="$a"; done\necho "$prev" >> {log}\n')
    listed.write_text("#!/bin/sh\nprintf 'hx1:1\\nhx2:1\\nhx3:1\\n'\n")
    for script in (agent, listed):
        script.chmod(0o755)
    elastic = ElasticConfig(min_np=2, max_np=3, timeout=0, discovery=str(listed))
    hosts = (("hx1", 1), ("hx2", 1))
    cfg = RunConfig(nprocs=2, command=("python",), hosts=hosts, elastic=elastic, run_dir=str(tmp_path))
    nxt, done = grow(cfg, {"PRTE_MCA_plm_ssh_agent": str(agent), "PATH": os.environ["PATH"]}, 1, seen_at=0.0)
    assert nxt is not None and nxt.nprocs == 3 and done.joined == ["hx3"]
    assert log.read_text().split() == ["hx3"]


#: An mpiexec that starts the ranks, then loses host cx2 as Open MPI does when a host is cut off: its
#: 14-line notice (a help text between two lines of dashes, ending with a NUL) blames a firewall.
LOSES_A_CUT_OFF_HOST = r"""#!/bin/sh
case "$1" in --version) echo "mpiexec (Open MPI) 5.0.5"; exit 0 ;; esac
echo "[0] UP"
rule=------------------------------------------------------------
printf '%s\nA daemon failed to report back after being spawned. This could\nbe due to several factors, including \
inability to find the\ndaemon executable.\n\n  Local host:    vm\n  Remote host:   cx2\n  Daemon exit status: 255\n\n\
This may also be caused by a firewall on the remote host. Please\ncheck that any firewall (e.g., iptables) has been \
disabled and\ntry again.\n%s\n\0' "$rule" "$rule" >&2
exit 0
"""


def test_a_host_cut_off_is_said_in_one_line_of_mldist_not_open_mpi_s_firewall_notice(tmp_path: Path) -> None:
    """Open MPI's notice for a host whose daemon stopped answering points at a firewall; mldist says what
    happened in its own line and keeps Open MPI's words in the run directory's mpiexec.log."""
    mpiexec, agent = tmp_path / "mpiexec", tmp_path / "agent"
    mpiexec.write_text(LOSES_A_CUT_OFF_HOST)
    agent.write_text("#!/bin/sh\nexit 0\n")
    for script in (mpiexec, agent):
        script.chmod(0o755)
    env = clean_env(PRTE_MCA_plm_ssh_agent=str(agent), MLDIST_MPIEXEC=str(mpiexec))
    run_dir = tmp_path / "run"
    args = ["run", "-H", "cx1:1,cx2:1", "--network-interface", "lo", "--run-dir", str(run_dir)]
    res = subprocess.run([PY, "-m", "mldist", *args, "--", "python", "-c", "pass"], capture_output=True, text=True,
                         env=env, timeout=120)  # fmt: skip
    assert res.returncode == 1, tail(res)
    assert "firewall" not in res.stderr and "A daemon failed" not in res.stderr, tail(res)
    assert (
        "mldist run: lost host cx2 (it stopped answering: down, or its link cut; Open MPI's daemon there did not "
        "report back); stopping the other workers"
    ) in res.stderr, tail(res)
    assert "check that any firewall" in (run_dir / "mpiexec.log").read_text()
