"""An elastic run's decisions after a failed round (mldist.launch.elastic), with a stand-in ssh.

The stand-in answers for the hosts listed in ANSWERING and fails for the others, as ssh does
for a host whose sshd is gone; tests/launch/test_hosts.py loses a real test host.
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

import pytest

from helpers import clean_env, mldist, tail
from mldist.base import rejoin
from mldist.errors import LaunchError
from mldist.launch.config import ElasticConfig, RunConfig
from mldist.launch.elastic import DISCOVER_EVERY, Watch, forget, grow, lost_hosts, reform
from mldist.launch.remote import LINGER_S, answering_hosts

HOSTS = (("hx1", 1), ("hx2", 1), ("hx3", 1))


@pytest.fixture
def ssh(tmp_path: Path) -> dict[str, str]:
    """An environment whose ssh agent answers for the hosts in ANSWERING (its last-but-one argument is the host)."""
    agent = tmp_path / "fake-ssh"
    agent.write_text('#!/bin/sh\nfor a in "$@"; do prev="$host"; host="$a"; done\n'
                     'case ",$ANSWERING," in *",$prev,"*) exit 0;; esac\nexit 255\n')  # fmt: skip
    agent.chmod(agent.stat().st_mode | stat.S_IXUSR)
    return {"PRTE_MCA_plm_ssh_agent": str(agent), "PATH": os.environ["PATH"]}


def _cfg(min_np: int = 2, timeout: float = 0.0, reset_limit: int | None = None) -> RunConfig:
    elastic = ElasticConfig(min_np=min_np, max_np=3, timeout=timeout, reset_limit=reset_limit)
    return RunConfig(nprocs=3, command=("python",), hosts=HOSTS, elastic=elastic)


def test_a_host_that_does_not_answer_is_lost_else_the_one_named(ssh: dict[str, str]) -> None:
    said = ["[2] mldist run: rank 2 exited with code 3 on hx2; stopping"]
    assert lost_hosts(HOSTS, said, {**ssh, "ANSWERING": "hx1,hx2"}) == (["hx3"], "does not answer over ssh")
    assert lost_hosts(HOSTS, said, {**ssh, "ANSWERING": "hx1,hx2,hx3"}) == (["hx2"], "its worker failed")
    assert lost_hosts(HOSTS, [], {**ssh, "ANSWERING": "hx1,hx2,hx3"}) == ([], "")


def test_the_host_whose_worker_ended_first_is_left_out_whatever_the_order_of_the_lines(ssh: dict[str, str]) -> None:
    """Peers of a failed worker fail in their collective a moment later; their shims' lines may come first."""
    said = ["[0] mldist run: rank 0 exited with code 14 on hx1 at 2026-11-27T06:30:15.140Z",
            "[1] mldist run: rank 1 exited with code 14 on hx2 at 2026-11-27T06:30:15.139Z",
            "[2] mldist run: rank 2 exited with code 3 on hx3 at 2026-11-27T06:30:15.101Z"]  # fmt: skip
    assert lost_hosts(HOSTS, said, {**ssh, "ANSWERING": "hx1,hx2,hx3"}) == (["hx3"], "its worker failed")


def test_the_world_re_forms_on_the_hosts_that_answer(ssh: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    nxt, done = reform(_cfg(), [], {**ssh, "ANSWERING": "hx1,hx2"}, lambda: False, 0, seen_at=0.0)
    assert nxt is not None and (nxt.hosts, nxt.nprocs) == ((("hx1", 1), ("hx2", 1)), 2)
    assert (done.lost, done.before, done.after) == (["hx3"], 3, 2)
    assert "re-forming the world on hx1,hx2: 2 worker(s) (--min-np 2)" in capsys.readouterr().err


def test_the_supervisor_s_probe_decides_without_asking_again(ssh: dict[str, str]) -> None:
    """The one supervisor probes the round's hosts once; reform() takes its answers (ssh would say all answer)."""
    answered = {"hx1": True, "hx2": True, "hx3": False}
    nxt, done = reform(_cfg(), [], {**ssh, "ANSWERING": "hx1,hx2,hx3"}, lambda: False, 0, 0.0, answered)
    assert nxt is not None and (done.lost, done.why, done.after) == (["hx3"], "does not answer over ssh", 2)


def test_below_min_np_it_waits_out_the_timeout_then_ends(
    ssh: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    nxt, done = reform(_cfg(min_np=3), [], {**ssh, "ANSWERING": "hx1,hx2"}, lambda: False, 1, seen_at=0.0)
    assert nxt is None and done.after == 0
    assert "2 slot(s) left, below --min-np 3 after waiting" in capsys.readouterr().err


def test_the_reset_limit_ends_the_run(ssh: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    nxt, _ = reform(_cfg(reset_limit=1), [], {**ssh, "ANSWERING": "hx1,hx2"}, lambda: False, 1, seen_at=0.0)
    assert nxt is None
    assert "the world re-formed 1 time(s), --reset-limit 1; ending" in capsys.readouterr().err


def _discovery(tmp_path: Path, hosts: str) -> str:
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nprintf '{hosts}'\n")
    script.chmod(0o755)
    return str(script)


def test_a_listed_host_that_answers_raises_the_workers_flag(ssh: dict[str, str], tmp_path: Path) -> None:
    """During a round of hx1 and hx2, the discovery script lists hx3 too: once hx3 answers, the flag the
    workers read at their next commit (mldist.base.rejoin) appears, naming it."""
    discovery = _discovery(tmp_path, "hx1\\nhx2\\nhx3\\n")
    elastic = ElasticConfig(min_np=2, max_np=3, timeout=0, discovery=discovery)
    cfg = RunConfig(nprocs=2, command=("python",), hosts=HOSTS[:2], elastic=elastic, run_dir=str(tmp_path / "run"))
    flag = rejoin.flag({"MLDIST_RUN_DIR": str(tmp_path / "run"), rejoin.RUN_ENV: "e1", "MLDIST_RESTART": "1"})
    assert flag is not None
    watch = Watch(cfg, {**ssh, "ANSWERING": "hx1,hx2"}, 1)  # hx3 listed but silent: no flag
    watch.start()
    time.sleep(2 * DISCOVER_EVERY + 1)
    watch.stop()
    assert not flag.exists()
    watch = Watch(cfg, {**ssh, "ANSWERING": "hx1,hx2,hx3"}, 1)
    watch.start()
    deadline = time.monotonic() + 4 * DISCOVER_EVERY
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    watch.stop()
    assert flag.read_text() == "hx3\n" and flag.stat().st_mode & 0o077 == 0


def test_the_world_grows_on_every_listed_host_that_answers(
    ssh: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elastic = ElasticConfig(min_np=2, max_np=3, timeout=0, discovery=_discovery(tmp_path, "hx1:1\\nhx2:1\\nhx3:1\\n"))
    cfg = RunConfig(nprocs=2, command=("python",), hosts=HOSTS[:2], elastic=elastic, run_dir=str(tmp_path))
    nxt, done = grow(cfg, {**ssh, "ANSWERING": "hx1,hx2,hx3"}, 1, seen_at=0.0)
    assert nxt is not None and (nxt.hosts, nxt.nprocs) == (HOSTS, 3)
    assert (done.joined, done.before, done.after) == (["hx3"], 2, 3)
    said = capsys.readouterr().err
    assert "host(s) hx3 joined; re-forming the world on hx1,hx2,hx3: 3 worker(s) (--max-np 3)" in said


def test_a_failed_run_forgets_its_commits_on_every_host(tmp_path: Path) -> None:
    agent, log = tmp_path / "log-ssh", tmp_path / "ssh.log"
    agent.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    agent.chmod(0o755)
    env = {"PRTE_MCA_plm_ssh_agent": str(agent), rejoin.RUN_ENV: "e0a1", rejoin.DIR_ENV: "/c d"}
    forget(["hx2", "hx1", "hx2"], env)
    lines = sorted(log.read_text().splitlines())
    assert [line.split()[4] for line in lines] == ["hx1", "hx2"], lines
    assert all(line.endswith("rm -rf -- '/c d'/mldist-\"$(id -u)\"/e0a1") for line in lines), lines
    forget(["hx1"], {"PRTE_MCA_plm_ssh_agent": str(agent)})  # not an elastic run: nothing asked
    assert len(log.read_text().splitlines()) == 2


def test_an_elastic_run_starts_without_a_silent_host_while_min_np_allows(
    ssh: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The check before the start (mldist.launch.remote.answering_hosts): an elastic world leaves a silent
    host out and starts with --min-np or more; below it, and in a fixed world, it names the host and stops."""
    env = {**ssh, "ANSWERING": "hx1,hx2"}
    cfg = answering_hosts(_cfg(min_np=2), env)
    assert (cfg.hosts, cfg.nprocs) == (HOSTS[:2], 2)
    assert "host hx3: ssh to it fails (ssh said nothing); starting without it (--min-np 2)" in capsys.readouterr().err
    with pytest.raises(LaunchError, match=r"^host hx3: ssh to it fails \(ssh said nothing\)$"):
        answering_hosts(_cfg(min_np=3), env)
    fixed = RunConfig(nprocs=3, command=("python",), hosts=HOSTS)
    with pytest.raises(LaunchError, match=r"^host hx2: ssh to it fails .*; hx3 failed the check too$"):
        answering_hosts(fixed, {**ssh, "ANSWERING": "hx1"})
    assert answering_hosts(fixed, {**ssh, "ANSWERING": "hx1,hx2,hx3"}) is fixed


#: An mpiexec that starts the ranks, hears that rank 1 failed, then waits for ever for the daemon of a host
#: that froze: it ignores the launcher's SIGUSR2 and SIGTERM, as Open MPI's does while it waits, and its ssh
#: session to that host (a session of its own, as Open MPI's are) holds its output open.
WAITS_FOR_A_FROZEN_DAEMON = """#!/bin/sh
case "$1" in --version) echo "mpiexec (Open MPI) 5.0.5"; exit 0 ;; esac
trap '' USR2 TERM INT HUP
setsid sleep 300 &
echo "[0] UP"
echo "[1] mldist run: rank 1 exited with code 3 on fz2 at 2026-11-27T06:30:15.101Z" >&2
while :; do sleep 1; done
"""


def test_an_mpiexec_that_waits_for_a_frozen_host_is_killed_after_the_grace(ssh: dict[str, str], tmp_path: Path) -> None:
    """mldist run -H: a rank failed and mpiexec still waits (for a frozen host's daemon, which never answers).
    The launcher kills mpiexec's process group --failure-grace + LINGER_S after the failure, says so in one
    line, and ends with the failed rank's code, where it waited for ever before."""
    mpiexec = tmp_path / "mpiexec"
    mpiexec.write_text(WAITS_FOR_A_FROZEN_DAEMON)
    mpiexec.chmod(0o755)
    env = clean_env(**ssh, ANSWERING="fz1,fz2", MLDIST_MPIEXEC=str(mpiexec))
    args = ["run", "-H", "fz1:1,fz2:1", "--network-interface", "lo", "--failure-grace", "1", "--no-run-dir"]
    started = time.monotonic()
    res = mldist([*args, "--", "python", "-c", "pass"], env=env, timeout=60)
    took = time.monotonic() - started
    print(f"mpiexec killed, the run ended {took:.1f} s after the start")
    assert res.returncode == 3, tail(res)
    assert re.search(r"^mldist run: mpiexec still runs 1[1-4] s after rank 1 exited with code 3 on fz2: it waits for "
                     r"a host that does not answer; killing it$", res.stderr, re.M), tail(res)  # fmt: skip
    assert "mldist run: rank 1 exited with code 3 on fz2; stopping the other workers" in res.stderr, tail(res)
    assert 1 + LINGER_S <= took < 1 + LINGER_S + 5, took
