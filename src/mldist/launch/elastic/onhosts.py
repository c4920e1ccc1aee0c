"""Elastic worlds on hosts: a lost host ends the round, and the workers start again on the others.

``mldist run -H h1:1,h2:1,h3:1 --min-np 2 --max-np 3`` (horovodrun's flags). When a host dies
or stops answering, mpiexec ends the job (its daemon there is gone, or a rank failed). A host
that freezes (nothing answers, no connection closes) ends it too: mpiexec's ssh sessions carry
keepalives (:func:`mldist.launch.hosts.keepalive_agent`), and an mpiexec still waiting for such
a host's daemon after a failure is killed (:data:`mldist.launch.remote.LINGER_S`). The
launcher then asks every host of the round over ssh, with the agent mpiexec uses, whether it
still answers; the hosts that do not, and the one mpiexec named, are lost. At or above
``--min-np`` workers on the rest, the world re-forms at once: a new round of mpiexec with
fresh ports, ``MLDIST_RESTART`` counting up, the ranks numbered anew. The workers' elastic
state (``hvd.elastic``, ``mldist.keras.Elastic``) resumes from its last commit. Below
``--min-np`` the launcher asks the lost hosts again every few seconds, up to
``--elastic-timeout``, then ends with one line. ``--reset-limit`` bounds the re-forms.

This is how torchrun re-forms, and the honest way with MPI: a running MPI world cannot
drop a rank, so every engine (MPI, RING, JAX) starts anew. The rounds run in the one elastic
supervisor (:mod:`.supervisor`; ``mldist.launch.local`` gives its hooks for elastic runs); this module holds what
is particular to hosts: the ssh probe, mpiexec's lines that name a lost host, the plan of the
next world and the discovery script.

Example:
    >>> plan((("hx1", 1), ("hx2", 1), ("hx3", 1)), {"hx3"}, min_np=2, max_np=3)
    ((('hx1', 1), ('hx2', 1)), 2)
    >>> plan((("hx1", 1), ("hx2", 1)), {"hx2"}, min_np=2, max_np=2) is None
    True
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from ...base import envvalues, rejoin
from ...base.files import atomic_write
from ...errors import LaunchError
from ...placement.hostlist import HOST_NAME, host_entry
from .. import fanout
from ..config import ElasticConfig, RunConfig
from ..hosts import ssh_agent as _agent
from ..procs import ended_at, say
from .supervisor import Reform, named

Hosts = tuple[tuple[str, int], ...]

#: mpiexec's lines when it lost its daemon on a host: "Remote daemon: [prterun-x@0,2] on node hx3" (the
#: daemon stopped answering), or "Remote host:   hx3" (the ssh session that started it ended).
LOST_DAEMON = re.compile(r"Remote daemon:\s+\S+ on node (\S+)|^\s*Remote host:\s+(\S+)\s*$")
#: A shim's line naming the host of the first failed rank (mldist.launch.remote_shim).
FAILED_ON = re.compile(r"mldist run: rank [0-9]+ (?:exited with code|was killed by) .* on (\S+)")
#: Seconds one reachability probe may take, and between probes while too few hosts answer.
PROBE_TIMEOUT, PROBE_EVERY = 10.0, 3.0
#: Seconds a probe's connection and handshake may take (ssh's ConnectTimeout; a TCP connect's too).
PROBE_CONNECT = 5.0
#: Seconds the discovery script may take, and between two of its runs during a round.
DISCOVERY_TIMEOUT, DISCOVER_EVERY = 10.0, 1.0


def parse_discovered(text: str, slots: int) -> Hosts:
    """The hosts a discovery script printed: ``host`` or ``host:slots`` a line (``slots`` where omitted).

    Example:
        >>> parse_discovered("hx1:2\\nhx2\\n\\n", 1)
        (('hx1', 2), ('hx2', 1))
        >>> parse_discovered("hx1; rm -rf /", 1)
        Traceback (most recent call last):
        ...
        mldist.errors.LaunchError: --host-discovery-script printed 'hx1; rm -rf /': print host or host:slots lines
    """
    hosts: list[tuple[str, int]] = []
    for line in filter(None, (raw.strip() for raw in text.splitlines())):
        entry = host_entry(line)
        if entry is None or not HOST_NAME.fullmatch(entry[0]) or entry[1] == 0:
            raise LaunchError(f"--host-discovery-script printed {line!r:.60}: print host or host:slots lines")
        if entry[0] not in {h for h, _ in hosts}:
            hosts.append((entry[0], slots if entry[1] is None else entry[1]))
    return tuple(hosts)


def discover(elastic: ElasticConfig, env: Mapping[str, str]) -> Hosts:
    """The hosts the discovery script lists now (LaunchError when it fails or prints something else)."""
    assert elastic.discovery is not None
    try:
        res = subprocess.run(
            [elastic.discovery], capture_output=True, text=True, timeout=DISCOVERY_TIMEOUT, env=dict(env), check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"--host-discovery-script {elastic.discovery!r} did not run: {exc}") from None
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or [""])[-1]
        raise LaunchError(f"--host-discovery-script {elastic.discovery!r} exited with {res.returncode}: {last:.120}")
    return parse_discovered(res.stdout, elastic.slots)


class Watch:
    """During a round: run the discovery script every few seconds; when it lists a host that answers and
    the world may grow, raise the workers' flag (:mod:`mldist.base.rejoin`) once."""

    def __init__(self, cfg: RunConfig, env: Mapping[str, str], round_: int) -> None:
        assert cfg.elastic is not None and cfg.run_dir
        self.cfg, self.env = cfg, env
        self.flag = rejoin.flag({envvalues.RUN_DIR.name: os.path.abspath(cfg.run_dir), rejoin.RUN_ENV: "1"}, round_)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=DISCOVERY_TIMEOUT + PROBE_TIMEOUT)

    def _run(self) -> None:
        cfg, elastic = self.cfg, self.cfg.elastic
        assert elastic is not None and self.flag is not None
        while not self.stopped.wait(DISCOVER_EVERY):
            if cfg.nprocs >= elastic.max_np:
                return
            try:
                listed = discover(elastic, self.env)
            except LaunchError as exc:
                say(f"{exc}; trying again")
                continue
            new = [h for h, _ in listed if h not in {host for host, _ in cfg.hosts}]
            joining = [h for h, ok in answering(new, self.env).items() if ok] if new else []
            if joining and not self.stopped.is_set():
                atomic_write(self.flag, ",".join(joining) + "\n", mode=0o600)
                say(f"host(s) {', '.join(joining)} can join: the workers leave at their next commit to re-form")
                return


def plan(hosts: Hosts, lost: Iterable[str], min_np: int, max_np: int) -> tuple[Hosts, int] | None:
    """The next round's hosts and worker count without the ``lost`` ones, or None below ``min_np``.

    Args:
        hosts: the hosts of the run, in order (rank 0's first).
        lost: hosts that are gone.
        min_np, max_np: the elastic bounds.
    """
    gone = set(lost)
    kept = tuple((host, slots) for host, slots in hosts if host not in gone)
    n = min(sum(slots for _, slots in kept), max_np)
    return (kept, n) if n >= min_np else None


def named_hosts(lines: Iterable[str]) -> list[str]:
    """Hosts that mpiexec's or a shim's lines name as lost or failed, in order.

    Example:
        >>> named_hosts(["  Remote daemon: [prterun-vm-33@0,3] on node hx3", "[1] mldist run: rank 1 exited "
        ...              "with code 3 on hx2; stopping", "[0] epoch 2", "  Remote host:   hx4", "  Local host: vm"])
        ['hx3', 'hx2', 'hx4']
    """
    return named(lines, (LOST_DAEMON, FAILED_ON))


def ssh_agent(env: Mapping[str, str]) -> list[str]:
    """The command mpiexec reaches the hosts with (Open MPI's ``plm_ssh_agent``), for a probe.

    Example:
        >>> ssh_agent({"PRTE_MCA_plm_ssh_agent": "ssh -F /t/cfg"})[:3]
        ['ssh', '-F', '/t/cfg']
    """
    return _agent(env, connect_timeout=PROBE_CONNECT)


def answering(
    hosts: Sequence[str], env: Mapping[str, str], timeout: float = PROBE_TIMEOUT, command: str = "true"
) -> dict[str, bool]:
    """Whether each host runs ``command`` (``true``) over ssh within ``timeout``: thousands at once, as the
    check before the start asks them (:func:`mldist.launch.hosts.silent_hosts`): a TCP connect finds the
    silent ones, ssh runs in a window on the rest, each host with its own ``timeout``."""
    agent, limit = ssh_agent(env), fanout.soft_limit()
    port = fanout.direct_port(agent, hosts, env)
    connect = min(timeout, PROBE_CONNECT)  # ssh's own ConnectTimeout in the agent
    silent = {} if port is None else fanout.tcp_screen(hosts, port, connect, fanout.window(len(hosts), limit))
    rest = [host for host in hosts if host not in silent]
    most = fanout.window(len(rest), limit, fanout.SSH_WINDOW)
    ran = fanout.run_all(rest, lambda host: [*agent, host, command], env, timeout, most)
    return {host: host not in silent and ran[host][0] == 0 for host in hosts}


def lost_hosts(
    hosts: Hosts, said: Iterable[str], env: Mapping[str, str], answered: Mapping[str, bool] | None = None
) -> tuple[list[str], str]:
    """The hosts of a round that ended in a failure that are lost, and why, in words.

    Hosts that do not answer (``answered``: the supervisor's probe, else asked now) are lost. When every
    host answers, the host mpiexec or a shim named first is left out, as Horovod leaves out a host whose
    worker failed.
    """
    in_order = sorted(said, key=ended_at)  # the worker that ended first, by the shims' clocks, is the cause
    failed = [h for h in named_hosts(in_order) if h in {host for host, _ in hosts}]
    asked = answered if answered is not None else answering([h for h, _ in hosts], env)
    silent = [host for host, ok in asked.items() if not ok]
    if silent:
        return silent, "does not answer over ssh" if len(silent) == 1 else "do not answer over ssh"
    if failed:
        return failed[:1], "its worker failed"
    return [], ""


def forget(hosts: Iterable[str], env: Mapping[str, str]) -> None:
    """After a failed elastic run: remove its commits from every host's memory (the workers remove theirs
    after a whole run); hosts that do not answer keep them until they restart."""
    if run_id := envvalues.ELASTIC_ID.read(env):
        answering(sorted(set(hosts)), env, command=rejoin.forget_command(env, run_id))


RESUMED = rejoin.RESUMED  # the workers' line once they resumed (mldist.base.rejoin)
#: An elastic run's id for its workers: where each host keeps their commits.
RUN_ENV = rejoin.RUN_ENV


def reform(
    cfg: RunConfig,
    said: Sequence[str],
    env: Mapping[str, str],
    stopping: Callable[[], bool],
    count: int,
    seen_at: float,
    answered: Mapping[str, bool] | None = None,
) -> tuple[RunConfig | None, Reform]:
    """After a failed round of an elastic run: the next round's config (None: end the run) and its record.

    Args:
        cfg: the round that failed (its hosts and worker count).
        said: mpiexec's and the shims' lines that name hosts (:func:`named_hosts`).
        env: the workers' environment (the ssh agent is mpiexec's).
        stopping: whether the launcher was asked to stop meanwhile.
        count: how many times the world re-formed before.
        seen_at: when the launcher saw the failure (``time.monotonic()``).
        answered: whether each host of the round answered the supervisor's probe (None: ask now).
    """
    assert cfg.elastic is not None
    elastic, t0 = cfg.elastic, time.monotonic()
    lost, why = lost_hosts(cfg.hosts, said, env, answered)
    record = Reform(lost=lost, why=why, before=cfg.nprocs, seen_at=seen_at)
    pool = cfg.hosts
    if elastic.discovery:  # the script's hosts now (a lost host it still lists stays lost until it answers)
        with contextlib.suppress(LaunchError):
            pool = discover(elastic, env) or cfg.hosts
    if elastic.reset_limit is not None and count >= elastic.reset_limit:
        say(f"the world re-formed {count} time(s), --reset-limit {elastic.reset_limit}; ending")
        return None, record
    lost_words = f"lost host {', '.join(lost)} ({why})" if lost else "a worker failed on a host that still answers"
    nxt = plan(cfg.hosts, lost, elastic.min_np, elastic.max_np)
    # A first start that reached no host is a setting to fix (names, keys), not a loss to wait out.
    never_started = count == 0 and lost == [h for h, _ in cfg.hosts]
    while nxt is None and time.monotonic() - t0 < elastic.timeout and not stopping() and not never_started:
        time.sleep(PROBE_EVERY)
        back = [h for h, ok in answering(lost, env).items() if ok]
        lost = [h for h in lost if h not in back]
        nxt = plan(pool, lost, elastic.min_np, elastic.max_np)
    record.hosts_checked_s = round(time.monotonic() - seen_at, 3)
    if nxt is None:
        slots = sum(s for h, s in pool if h not in lost)
        say(
            f"{lost_words}; {slots} slot(s) left, below --min-np {elastic.min_np} after waiting "
            f"{record.hosts_checked_s:.0f} s (--elastic-timeout {elastic.timeout:g}); ending"
        )
        return None, record
    hosts, n = nxt
    record.after = n
    names = ",".join(h for h, _ in hosts)
    say(f"{lost_words}; re-forming the world on {names}: {n} worker(s) (--min-np {elastic.min_np})")
    return dataclasses.replace(cfg, hosts=hosts, nprocs=n), record


def grow(cfg: RunConfig, env: Mapping[str, str], count: int, seen_at: float) -> tuple[RunConfig | None, Reform]:
    """After the workers left at a commit for hosts that joined: the next round on every host that answers."""
    assert cfg.elastic is not None
    elastic = cfg.elastic
    record = Reform(lost=[], why="hosts joined", before=cfg.nprocs, seen_at=seen_at)
    if elastic.reset_limit is not None and count >= elastic.reset_limit:
        say(f"the world re-formed {count} time(s), --reset-limit {elastic.reset_limit}; ending")
        return None, record
    try:
        pool = discover(elastic, env) if elastic.discovery else cfg.hosts
    except LaunchError as exc:
        say(f"{exc}; going on with the same hosts")
        pool = cfg.hosts
    # Only the hosts new to the world: the round's own just left together at a commit, known good.
    new = [h for h, _ in pool if h not in {host for host, _ in cfg.hosts}]
    silent = [h for h, ok in answering(new, env).items() if not ok]
    nxt = plan(pool, silent, elastic.min_np, elastic.max_np) or plan(cfg.hosts, [], elastic.min_np, elastic.max_np)
    assert nxt is not None  # the round's own hosts were enough
    hosts, n = nxt
    record.joined = [h for h, _ in hosts if h not in {host for host, _ in cfg.hosts}]
    record.lost, record.after = [h for h, _ in cfg.hosts if h not in {host for host, _ in hosts}], n
    names = ",".join(h for h, _ in hosts)
    said = f"host(s) {', '.join(record.joined)} joined" if record.joined else "no host joined after all"
    say(f"{said}; re-forming the world on {names}: {n} worker(s) (--max-np {elastic.max_np})")
    return dataclasses.replace(cfg, hosts=hosts, nprocs=n), record
