"""What ``mldist run`` was asked to do: the validated ``RunConfig`` and the checks made before any start.

Nothing here starts a process: the process utilities (:mod:`mldist.launch.procs`),
the groups and the supervisor (:mod:`mldist.launch.local`) all read this module,
and it reads none of them.

Example:
    >>> cfg = RunConfig(nprocs=2, command=("python", "train.py"), communication="ring")
    >>> cfg.nprocs, cfg.communication, cfg.network
    (2, 'ring', 'auto')
    >>> RunConfig(nprocs=0, command=("python",))
    Traceback (most recent call last):
    ...
    mldist.errors.ConfigError: -n 0: start 1 to 4096 workers on one host
"""

from __future__ import annotations

import os
import re
import resource
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..base import envvalues
from ..errors import ConfigError, LaunchError
from ..placement.allocation import Allocation
from ..placement.engines import COMMUNICATIONS, Decision
from ..placement.hostlist import HOST_NAME

#: The values of ``--network``: where directly started workers' servers listen.
NETWORKS = ("auto", "private", "host")
#: The most workers ``mldist run`` starts on one host.
MAX_WORKERS = 4096
#: A ``--network-interface`` (a name, or an address/CIDR); host names follow the one host-list grammar
#: (:data:`mldist.placement.hostlist.HOST_NAME`).
INTERFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,63}")
#: A variable name of ``RunConfig.env``: what a shell and ``mpiexec -x`` accept.
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
#: Seconds a host of ``-H``/``--hostfile`` has to answer over ssh before the run starts (``--connect-timeout``).
#: A test host answers (key exchange, login, ``true``) in 0.2-0.6 s on a busy 2-core machine, and cluster
#: logins that wait on LDAP or a home directory take a few seconds: 10 s is ample for a host that is up and
#: short for a user waiting on one that is not (mpiexec itself would wait for ever).
CONNECT_TIMEOUT = 10.0
#: Descriptors the launcher holds per worker (output pipes, FIFOs, ports while choosing), and for itself.
_FDS_PER_WORKER, _FDS_BASE = 6, 64


@dataclass(frozen=True)
class ElasticConfig:
    """An elastic world on hosts (horovodrun's ``--min-np``, ``--max-np``, ...): see :mod:`mldist.launch.elastic`.

    Args:
        min_np: the fewest workers training may go on with; below, the run waits ``timeout``, then ends.
        max_np: the most workers it grows to.
        timeout: seconds to wait for enough hosts (``--elastic-timeout``).
        reset_limit: how many times the world may re-form (None: no limit).
        discovery: a script that prints the hosts that may be used, one ``host[:slots]`` a line
            (``--host-discovery-script``); hosts it adds join at the workers' next commit.
        slots: slots of a host the script names without them (``--slots-per-host``).

    Example:
        >>> ElasticConfig(min_np=2, max_np=4).timeout
        600.0
        >>> ElasticConfig(min_np=3, max_np=2)
        Traceback (most recent call last):
        ...
        mldist.errors.ConfigError: --min-np 3 --max-np 2: give 1 <= --min-np <= --max-np
    """

    min_np: int
    max_np: int
    timeout: float = 600.0
    reset_limit: int | None = None
    discovery: str | None = None
    slots: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min_np <= self.max_np <= MAX_WORKERS:
            raise ConfigError(f"--min-np {self.min_np} --max-np {self.max_np}: give 1 <= --min-np <= --max-np")
        if not 0 <= self.timeout <= 7 * 86400:
            raise ConfigError(f"--elastic-timeout {self.timeout}: give 0 to 604800 seconds")
        if self.reset_limit is not None and self.reset_limit < 0:
            raise ConfigError(f"--reset-limit {self.reset_limit} cannot be negative")
        if self.slots < 1:
            raise ConfigError(f"--slots-per-host {self.slots}: give 1 or more")


@dataclass(frozen=True)
class RunConfig:
    """What ``mldist run`` was asked to do.

    Args:
        nprocs: number of workers.
        command: argv of each worker.
        log_dir: write ``rank-R.log`` files here instead of prefixed output.
        grace: seconds workers get after a forwarded SIGINT/SIGTERM.
        failure_grace: seconds the others get after one worker failed.
        cpu_bind: "none", or "cores" to give each worker its own CPUs.
        max_restarts: restart the whole group this many times after a worker
            failure (not after exit code 75 or a signal to the launcher).
        communication: the workers' engine: "auto" and "mpi" start them through
            mpiexec when one is found (one MPI world), "ring"/"nccl" start them directly.
        network: for workers started directly (TensorFlow's engines): "private" runs them in
            a network namespace of their own, "host" on this host's network, "auto" private
            where the platform allows it.
        verbose: show TensorFlow's start-up notices too (hidden by default: every rank repeats them).
        profile_steps: "A:B" to record a timeline of those steps on every rank (``MLDIST_PROFILE_STEPS``).
        run_dir: the run directory (config.json, rank-R.log, summary.json; ``MLDIST_RUN_DIR``
            for the workers), or None for none; see :mod:`mldist.launch.rundir`.
        hosts: ``(host, slots)`` to start the workers on other hosts (through mpiexec's ssh), or ()
            for this host.
        network_interface: with ``hosts``, the interface (name, or address/CIDR as Open MPI takes
            it) that MPI and its launcher use between the hosts.
        mpi_args: more arguments for mpiexec, before the command (horovodrun's ``--mpi-args``).
        env: what the workers get beyond the launcher's own environment (the launcher decides
            with it too: ``KERAS_BACKEND`` here chooses the workers' engine); the launcher's
            process environment is never changed.
        decision: the engine decision (:func:`mldist.placement.engines.decide`): None as
            the CLI builds it, set by the launcher once it has decided, then read by every part.
        elastic: with ``hosts``, an elastic world (:class:`ElasticConfig`): a lost host re-forms the
            world on the others instead of ending the run; None for a fixed world.
        allocation: the batch allocation whose nodes ``hosts`` are (:mod:`mldist.placement.allocation`):
            the workers start through its scheduler's launcher (:mod:`mldist.launch.allocated`), not ssh.
        connect_timeout: with ``hosts`` (not an allocation's), seconds each has to answer over ssh before
            the workers start (``--connect-timeout``); one that does not is named and nothing starts.
        stage_to: with ``allocation``, ``--stage-env``: this Python's environment is copied to the nodes once
            each, under this node-local directory (tmpdir, tmp, shm or a path), and the workers run from
            there (:func:`mldist.launch.allocated.stage`); None: from where it is.

    Example:
        >>> RunConfig(nprocs=4, command=("python", "train.py"), max_restarts=2).max_restarts
        2
        >>> RunConfig(nprocs=2, command=("python",), env={"KERAS_BACKEND": "jax"}).env["KERAS_BACKEND"]
        'jax'
    """

    nprocs: int
    command: tuple[str, ...]
    log_dir: str | None = None
    grace: float = 60.0
    failure_grace: float = 5.0
    cpu_bind: str = "none"
    max_restarts: int = 0
    communication: str = "auto"
    network: str = "auto"
    verbose: bool = False
    profile_steps: str | None = None
    run_dir: str | None = None
    hosts: tuple[tuple[str, int], ...] = ()
    network_interface: str | None = None
    mpi_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    decision: Decision | None = None
    elastic: ElasticConfig | None = None
    allocation: Allocation | None = None
    connect_timeout: float = CONNECT_TIMEOUT
    stage_to: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.nprocs <= MAX_WORKERS:
            raise ConfigError(f"-n {self.nprocs}: start 1 to {MAX_WORKERS} workers on one host")
        if not self.command:
            raise ConfigError("no command given: mldist run -n 2 -- python train.py")
        for name, value in (("--grace", self.grace), ("--failure-grace", self.failure_grace)):
            if not 0 <= value <= 7 * 86400:  # also refuses nan and inf: a kill must follow
                raise ConfigError(f"{name} {value}: give 0 to 604800 seconds")
        if self.cpu_bind not in ("none", "cores"):
            raise ConfigError(f"--cpu-bind {self.cpu_bind!r}: use 'none' or 'cores'")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts {self.max_restarts} cannot be negative")
        if self.network not in NETWORKS:
            raise ConfigError(f"--network {self.network!r} is not one of {', '.join(NETWORKS)}")
        if self.communication not in COMMUNICATIONS:
            raise ConfigError(f"--communication {self.communication!r} is not one of {', '.join(COMMUNICATIONS)}")
        self._check_hosts()
        self._check_elastic()
        for var, text in self.env.items():
            if not (isinstance(var, str) and VARIABLE.fullmatch(var) and isinstance(text, str) and "\0" not in text):
                raise ConfigError(
                    f"worker variable {var!r}={text!r}: give NAME=value, the name of letters, digits and _"
                )

    def _check_hosts(self) -> None:
        """``hosts`` and what goes with it: slots for every worker, the options that need one host."""
        for host, slots in self.hosts:
            if not HOST_NAME.fullmatch(host) or slots < 1:
                raise ConfigError(f"-H {host}:{slots}: give host names with 1 or more slots (e.g. node1:2)")
        if self.allocation is not None and (not self.hosts or self.elastic is not None):
            raise ConfigError("inside an allocation the workers go over its nodes: no -H, no --min-np (or --local)")
        if self.hosts and self.nprocs > sum(slots for _, slots in self.hosts):
            raise ConfigError(f"-n {self.nprocs} is more than the {sum(s for _, s in self.hosts)} slots of -H")
        if self.hosts and (self.log_dir or self.cpu_bind != "none"):
            raise ConfigError(
                "-H/--hostfile: --log-dir and --cpu-bind are for one host; the run directory has the logs"
            )
        if not 1 <= self.connect_timeout <= 3600:  # ssh counts whole seconds
            raise ConfigError(f"--connect-timeout {self.connect_timeout:g}: give 1 to 3600 seconds")
        if envvalues.TF_CONFIG.read(self.env) and (self.hosts or self.allocation is not None):
            raise ConfigError(
                "--tf-config: TF_CONFIG lists every worker's address, which the ranks on other hosts learn only "
                "from MPI once started; drop --tf-config and call mldist.init() (or run on one host)"
            )
        if self.network == "private" and (self.hosts or self.allocation is not None):
            raise ConfigError(
                "--network private keeps workers on this host's loopback; with other hosts they must reach each "
                "other: drop --network private (--network-interface names the network between the hosts)"
            )
        if self.network_interface is not None and not self.hosts:
            raise ConfigError(
                f"--network-interface {self.network_interface!r} chooses the network between hosts, and this run "
                "has no other host: drop it, or give the hosts with -H or --hostfile"
            )
        if self.network_interface is not None and not INTERFACE.fullmatch(self.network_interface):
            raise ConfigError(
                f"--network-interface {self.network_interface!r} is not an interface or address/CIDR: "
                "give one such as ib0 or 10.1.0.0/16"
            )

    def check_backend(self, decision: Decision) -> None:
        """Refuse what the decided Keras backend (``decision``) would leave unread.

        ``--tf-config`` gives TF_CONFIG to tf.distribute's MultiWorkerMirroredStrategy; where Keras does not
        run on TensorFlow (JAX) no strategy reads it and a model cannot go into one, so the run would train
        one copy per worker.

        Example:
            >>> cfg = RunConfig(nprocs=2, command=("python",), env={"MLDIST_TF_CONFIG": "1"})
            >>> cfg.check_backend(Decision("jax", backend="jax"))
            Traceback (most recent call last):
            ...
            mldist.errors.ConfigError: --tf-config gives TF_CONFIG to TensorFlow's MultiWorkerMirroredStrategy, \
but KERAS_BACKEND=jax: Keras on jax never reads it; drop --tf-config (mldist.init() or \
keras.distribution.initialize() form the group), or set KERAS_BACKEND=tensorflow
        """
        if envvalues.TF_CONFIG.read(self.env) and not decision.traits.runs_tensorflow:
            raise ConfigError(
                "--tf-config gives TF_CONFIG to TensorFlow's MultiWorkerMirroredStrategy, but "
                f"KERAS_BACKEND={decision.backend}: Keras on {decision.backend} never reads it; drop --tf-config "
                "(mldist.init() or keras.distribution.initialize() form the group), or set KERAS_BACKEND=tensorflow"
            )

    def _check_elastic(self) -> None:
        """An elastic world: hosts to lose, -n between its bounds, and no fixed-world restarts."""
        if self.elastic is None:
            return
        if not self.hosts:
            raise ConfigError("--min-np/--max-np: an elastic world needs other hosts (-H or --hostfile)")
        if not self.elastic.min_np <= self.nprocs <= self.elastic.max_np:
            raise ConfigError(
                f"-n {self.nprocs}: give --min-np {self.elastic.min_np} <= -n <= --max-np {self.elastic.max_np}"
            )
        if self.max_restarts:
            raise ConfigError(
                "--max-restarts restarts a fixed world; an elastic one (--min-np/--max-np) re-forms on its own "
                "(--reset-limit bounds how often)"
            )
        if self.elastic.discovery and not self.run_dir:
            raise ConfigError(
                "--host-discovery-script: hosts join through the run directory (the workers read a flag there); "
                "drop --no-run-dir"
            )


def command_problem(program: str, path: str | None) -> str:
    """Why the worker command ``program`` cannot start on this host ("" when it can).

    Args:
        program: the command's first word (a path, or a name looked up on ``path``).
        path: the workers' ``PATH``.

    Example:
        >>> command_problem("/", None)
        "cannot start '/': it is a directory; give the program or script in it (e.g. python /train.py)"
        >>> command_problem("sh", "/bin:/usr/bin")
        ''
    """
    if "/" not in program:
        found = shutil.which(program, path=path)
        return "" if found else f"cannot start {program!r}: no such program on PATH; give its path or install it"
    if os.path.isdir(program):
        example = os.path.join(program, "train.py")
        return f"cannot start {program!r}: it is a directory; give the program or script in it (e.g. python {example})"
    if not os.path.exists(program):
        return f"cannot start {program!r}: no such file; check the path"
    if not os.access(program, os.X_OK):
        return f"cannot start {program!r}: it is not executable; chmod +x it, or name its interpreter (python ...)"
    return ""


def prepare_log_dir(path: str) -> None:
    """Create ``--log-dir`` (owner-only) or raise ConfigError saying why it cannot hold the logs.

    Args:
        path: the ``--log-dir`` value.

    Example:
        >>> import os, tempfile
        >>> logs = os.path.join(tempfile.mkdtemp(), "logs")
        >>> prepare_log_dir(logs); os.path.isdir(logs)
        True
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--log-dir {path!r} is a file; name a directory")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--log-dir {path!r} cannot be created ({exc.strerror}); name a writable directory") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"--log-dir {path!r} is not writable; name a writable directory")


def ensure_descriptors(nprocs: int, on_hosts: tuple[int, int] | None = None) -> None:
    """Raise the soft open-file limit as far as needed for ``nprocs`` workers, or refuse with the reason.

    Args:
        nprocs: how many workers the launcher will hold pipes and ports for.
        on_hosts: for workers on other hosts (``-H``): the launcher's need from its descriptor plan
            (:func:`mldist.launch.fanout.descriptor_plan`, which grows with the hosts, not the ranks)
            and the number of hosts.

    Example:
        >>> ensure_descriptors(2)  # 76 descriptors: every shell allows that many
    """
    need = _FDS_BASE + _FDS_PER_WORKER * nprocs if on_hosts is None else on_hosts[0]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return
    if on_hosts is not None:
        raise LaunchError(
            f"-n {nprocs} on {on_hosts[1]} hosts needs about {need} open files but this shell allows "
            f"{hard} (ulimit -Hn); raise the limit"
        )
    raise LaunchError(
        f"-n {nprocs} needs about {need} open files but this shell allows {hard} (ulimit -Hn); "
        f"start at most {(hard - _FDS_BASE) // _FDS_PER_WORKER} workers or raise the limit"
    )
