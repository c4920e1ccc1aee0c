"""What a batch job asks for: one validated, frozen ``JobSpec``, the bottom type of launch/batch.

It imports no other part of launch/batch but the shell-word parser (expand): the
schedulers, launchers and the script take a ``JobSpec``, and the checks that need
their tables (a known scheduler and launcher, an output directory its directives
can carry) are in :mod:`.checks`, which ``build_spec`` and ``render`` run.

Values that end up in scheduler directives (``#SBATCH``, ``#PBS``, ``#COBALT``)
are checked against strict patterns: directives are parsed by the scheduler,
not by a shell, so quoting cannot make every character safe there. Values
that end up in the script body are quoted with ``shlex`` and may hold anything
but a NUL byte.

Example:
    >>> spec = JobSpec(command=("python", "train.py"), nodes=2, time="1:30:00")
    >>> spec.total_tasks, spec.time_seconds
    (2, 5400)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from ...errors import ConfigError
from .expand import pieces

# Matched with fullmatch: a trailing newline must not pass (it would end a directive line).
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_WORD = re.compile(r"[A-Za-z0-9_.:,+=@/-]+")
_MEM = re.compile(r"\d+[KMGT]?B?", re.IGNORECASE)
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Images apptainer pulls; anything else in --container is a local SIF path.
URI = re.compile(r"(docker|library|oras|shub)://[A-Za-z0-9][A-Za-z0-9._/:@+-]*")
#: srun --mpi plugin names (pmix, pmix_v4, pmi2, cray_shasta, none) or auto.
SRUN_MPI_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
#: A network interface name, or an address/CIDR (as Open MPI's *_if_include take them).
INTERFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,63}")
#: The placeholders --wrap fills in per rank.
WRAP_FIELDS = ("rank", "local_rank", "job_id", "job_dir")
GPU_REQUESTS = ("node", "task", "total")
#: Any number of digits: a time of too many is said to be too long, not malformed (a length bound comes first).
_TIME = re.compile(r"(?:([0-9]+)-)?([0-9]+)(?::([0-9]{1,2}))?(?::([0-9]{1,2}))?")
#: The longest wall time accepted: a year (a longer one is a typo).
MAX_TIME_SECONDS = 365 * 86400


def parse_time(text: str) -> int:
    """Seconds in a Slurm-style time: ``M``, ``H:MM:SS`` or ``D-HH:MM:SS``.

    Example:
        >>> parse_time("90"), parse_time("1:00:00"), parse_time("1-00:00:00")
        (5400, 3600, 86400)
    """
    m = _TIME.fullmatch(text) if len(text) <= 64 else None
    if not m:
        raise ConfigError(f"--time {text!r} is not M, H:MM:SS or D-HH:MM:SS (e.g. 2:00:00)")
    days, a, b, c = (int(g) if g else None for g in m.groups())
    if any(v is not None and v > 59 for v in (b, c)):
        raise ConfigError(f"--time {text!r}: minutes and seconds go up to 59 (e.g. 2:30:00)")
    if days is not None and b is None:  # D-H
        seconds = a * 3600  # type: ignore[operator]
    elif b is None:  # minutes
        seconds = a * 60  # type: ignore[operator]
    elif c is None:  # H:M in D-H:M, else M:S
        seconds = a * 3600 + b * 60 if days is not None else a * 60 + b  # type: ignore[operator]
    else:
        seconds = a * 3600 + b * 60 + c  # type: ignore[operator]
    seconds += (days or 0) * 86400
    if seconds <= 0:
        raise ConfigError(f"--time {text!r} must be longer than zero")
    if seconds > MAX_TIME_SECONDS:
        raise ConfigError(f"--time {text!r} is longer than a year (the limit: 365-00:00:00); give the job's real limit")
    return seconds


@dataclass(frozen=True)
class JobSpec:
    """A batch job, scheduler-independent.

    Args:
        command: argv of each task.
        scheduler: "slurm", "pbs" or "cobalt".
        nodes, tasks_per_node, gpus_per_node, cpus_per_task: geometry
            (``tasks_per_node`` defaults to one per GPU, else 1).
        mem, time, dependency, array, account, queue, job_name, constraint:
            scheduler options (``queue`` is Slurm's partition).
        output_dir: where the script, logs and environment record go.
        directives: raw extra directive lines' arguments (e.g. ``--exclusive``).
        modules, venv, conda, container, env, unset: the software environment.
        binds: extra directories bound into the container.
        requeue: signal before the time limit and requeue on exit code 75.
        tf_config: give each rank ``TF_CONFIG`` (``MLDIST_TF_CONFIG=1``; the ranks' start-up hook
            writes it), for scripts written for ``tf.distribute.MultiWorkerMirroredStrategy``.
        grace: seconds between that signal and the time limit.
        hyperthreads: hardware threads used per core (aprun ``-j``); threads per rank count them.
        launcher: srun, aprun, pals, openmpi or hydra (default: the scheduler's).
        network_interface: the interface (name, or address/CIDR) MPI uses between the nodes
            (``OMPI_MCA_btl_tcp_if_include``, ``PRTE_MCA_oob_tcp_if_include``, a name also as
            ``NCCL_SOCKET_IFNAME``); None: the MPI library's own choice.
        srun_mpi: srun's ``--mpi`` plugin ("pmix", "pmi2", "cray_shasta", "none", ...), or "auto"/None:
            PMIx when Slurm offers it and mpi4py's MPI is Open MPI, else the site's default.
        cores_per_node: physical cores of a node; without it (and ``cpus_per_task``) the
            job measures them when it starts. Threads per rank = cores x hyperthreads / tasks.
        module_purge: ``module purge`` before the ``modules`` load.
        mem_per_cpu: Slurm ``--mem-per-cpu``.
        gpu_request: how Slurm is asked for GPUs: "node" (``--gpus-per-node``), "task"
            (``--gpus-per-task=1``, one GPU per rank) or "total" (``--gpus``).
        wrap: words before each rank's command (a profiler); ``{rank}``, ``{local_rank}``,
            ``{job_id}`` and ``{job_dir}`` are filled in per rank, ``{array_index}`` per array task.
        env_source: shell files sourced after the modules load (e.g. a tool's ``vars.sh``).
        container_args: extra ``apptainer exec`` options (binds, ``--rocm``, ...).
        container_cache: where a pulled ``docker://``/``library://`` image is kept (default: the job directory).
        mldist_path: the submitting mldist package, bound into a container that has none.
        min_nodes: an elastic job: it keeps its allocation when a node fails (Slurm ``--no-kill``) and
            goes on while at least this many nodes remain (:mod:`mldist.launch.batch.agent`).
        nodes_range: ask for ``min_nodes``-``nodes`` nodes and start on what the scheduler gives
            (``--nodes 2-4``), not for ``nodes`` exactly.
        stage_env: run the ranks from a copy of the environment on node-local storage (:mod:`.staging`).
        stage_path: the environment staged: the venv, the conda environment's path, or the submitting
            mldist's ``sys.prefix``; None with a conda environment named: the activated one's.
        stage_to: where on a node: ``tmpdir`` ($TMPDIR, else /tmp), ``tmp``, ``shm`` (/dev/shm) or a path.
    """

    command: tuple[str, ...]
    scheduler: str = "slurm"
    nodes: int = 1
    tasks_per_node: int | None = None
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    mem: str | None = None
    time: str | None = None
    dependency: str | None = None
    array: str | None = None
    account: str | None = None
    queue: str | None = None
    job_name: str = "mldist"
    output_dir: str = "mldist-jobs"
    constraint: str | None = None
    directives: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    venv: str | None = None
    conda: str | None = None
    container: str | None = None
    binds: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    unset: tuple[str, ...] = ()
    requeue: bool = False
    tf_config: bool = False
    grace: int = 90
    hyperthreads: int = 1
    launcher: str | None = None
    srun_mpi: str | None = None
    network_interface: str | None = None
    cores_per_node: int | None = None
    module_purge: bool = False
    mem_per_cpu: str | None = None
    gpu_request: str = "node"
    wrap: tuple[str, ...] = ()
    env_source: tuple[str, ...] = ()
    container_args: tuple[str, ...] = ()
    container_cache: str | None = None
    mldist_path: str | None = None
    min_nodes: int | None = None
    nodes_range: bool = False
    stage_env: bool = False
    stage_path: str | None = None
    stage_to: str = "tmpdir"

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def tasks(self) -> int:
        """Tasks per node after the GPU default."""
        if self.tasks_per_node is not None:
            return self.tasks_per_node
        return self.gpus_per_node or 1

    @property
    def total_tasks(self) -> int:
        """Tasks in the whole job."""
        return self.nodes * self.tasks

    @property
    def threads(self) -> int | None:
        """Threads per rank known when the script is written, or None: measured when the job starts."""
        if self.cpus_per_task:
            return self.cpus_per_task
        if self.cores_per_node:
            return max(1, self.cores_per_node * self.hyperthreads // self.tasks)
        return None

    @property
    def remote_image(self) -> bool:
        """True when ``container`` is an image to pull (``docker://``, ``library://``, ...)."""
        return bool(self.container and URI.fullmatch(self.container))

    @property
    def time_seconds(self) -> int | None:
        """The time limit in seconds, if one was given."""
        return parse_time(self.time) if self.time else None


def _check(value: str | None, pattern: re.Pattern[str], what: str, hint: str) -> None:
    if value is not None and not pattern.fullmatch(value):
        raise ConfigError(f"{what} {value!r} is refused: {hint}")


#: An array's indices: N, N-M or N-M:STEP, comma-separated, and a throttle %K (at most K at once).
ARRAY = re.compile(
    r"([0-9]{1,7}(?:-[0-9]{1,7}(?::[0-9]{1,7})?)?(?:,[0-9]{1,7}(?:-[0-9]{1,7}(?::[0-9]{1,7})?)?)*)"
    r"(?:%([0-9]{1,7}))?"
)


def _check_array(array: str | None) -> None:
    """``--array``: indices and ranges that go up, steps and a throttle of at least 1.

    Example:
        >>> _check_array("0-9:2,20%3")
        >>> _check_array("3-1")
        Traceback (most recent call last):
        ...
        mldist.errors.ConfigError: --array '3-1': the range 3-1 goes down; write the smaller index first (1-3)
    """
    if array is None:
        return
    match = ARRAY.fullmatch(array)
    if not match:
        raise ConfigError(
            f"--array {array!r}: give indices and ranges like 0-9, 1,3,5, 0-99:10, and %K to run "
            "at most K at once (0-9%2)"
        )
    for item in match.group(1).split(","):
        low, _, rest = item.partition("-")
        high, _, step = rest.partition(":")
        if high and int(high) < int(low):
            raise ConfigError(
                f"--array {array!r}: the range {item} goes down; write the smaller index first ({high}-{low})"
            )
        if step and int(step) < 1:
            raise ConfigError(f"--array {array!r}: the step of {item} must be at least 1")
    if match.group(2) is not None and int(match.group(2)) < 1:
        raise ConfigError(f"--array {array!r}: %{match.group(2)} must allow at least 1 task at once")


def _validate(s: JobSpec) -> None:
    if not s.command:
        raise ConfigError("no command given: mldist submit -- python train.py")
    if not s.command[0].strip():  # a job that could only fail with 'command not found'
        raise ConfigError(
            f"the job's program {s.command[0]!r} is empty: give the command after --, e.g. "
            "mldist submit -- python train.py"
        )
    if s.gpus_per_node < 0:  # checked first: the default tasks per node is derived from it
        raise ConfigError(f"--gpus-per-node {s.gpus_per_node} cannot be negative")
    for name, value in (
        ("--nodes", s.nodes),
        ("--tasks-per-node", s.tasks),
        ("--hyperthreads", s.hyperthreads),
        ("--cores-per-node", s.cores_per_node or 1),
    ):
        if value < 1:
            raise ConfigError(f"{name} {value} must be at least 1")
    for name, opt in (("--gpus-per-node", s.gpus_per_node), ("--grace", s.grace)):
        if opt < 0:
            raise ConfigError(f"{name} {opt} cannot be negative")
    if s.cpus_per_task is not None and s.cpus_per_task < 1:
        raise ConfigError(f"--cpus-per-task {s.cpus_per_task} must be at least 1")
    if not _NAME.fullmatch(s.job_name):
        raise ConfigError(
            f"--job-name {s.job_name!r} is refused: use a letter, then letters, digits, '_', '.', '-' (max 64)"
        )
    plain = "use letters, digits and _.:,+=@/- only"
    for what, word in (
        ("--account", s.account),
        ("--queue", s.queue),
        ("--constraint", s.constraint),
        ("--dependency", s.dependency),
    ):
        _check(word, _WORD, what, plain)
    _check_array(s.array)
    _check(s.mem, _MEM, "--mem", "give a size like 32G or 4000M")
    _check(s.mem_per_cpu, _MEM, "--mem-per-cpu", "give a size like 4G or 4000M")
    _validate_recipe(s)
    if s.time is not None:
        parse_time(s.time)
    _validate_lines(s)
    if s.venv and s.conda:
        raise ConfigError("--venv and --conda exclude each other; pick one")
    texts = [*s.command, *s.modules, *s.binds, *(v for _, v in s.env), *s.wrap, *s.env_source, *s.container_args]
    texts += [t for t in (s.venv, s.conda, s.container, s.container_cache, s.mldist_path, s.stage_path) if t]
    for text in texts:
        if "\0" in text:
            raise ConfigError(f"{text!r} contains a NUL byte, which no shell can pass on")
    if s.min_nodes is not None and not 1 <= s.min_nodes <= s.nodes:
        raise ConfigError(f"--min-nodes {s.min_nodes} must be between 1 and --nodes {s.nodes}")
    if s.requeue and s.time is None:
        raise ConfigError("--requeue needs --time: the signal is sent --grace seconds before the limit")
    if s.requeue and s.time_seconds is not None and s.grace >= s.time_seconds:
        raise ConfigError(f"--grace {s.grace} s is not shorter than --time {s.time}")


def _validate_lines(s: JobSpec) -> None:
    """Raw directives (one line each, not empty) and the names of the variables set or unset."""
    for d in s.directives:
        if any(c in d for c in "\n\r\0"):
            raise ConfigError(f"--directive {d!r} is refused: directives are one line each")
        if not d.strip():
            raise ConfigError(f"--directive {d!r} is empty: give the scheduler option, e.g. --directive --exclusive")
    for key, _ in s.env:
        if not _ENV_KEY.fullmatch(key):
            raise ConfigError(f"--env {key!r} is not a variable name (letters, digits, _)")
    for key in s.unset:
        if not _ENV_KEY.fullmatch(key):
            raise ConfigError(f"unset {key!r} is not a variable name")


def _validate_node(s: JobSpec) -> None:
    """A node holds its ranks: a GPU each when GPUs are asked, and the CPUs they ask when its cores are known."""
    if s.gpus_per_node and s.tasks > s.gpus_per_node:  # init() gives local rank i GPU i: the rest would have none
        many = s.tasks - s.gpus_per_node > 1
        idle = f"ranks {s.gpus_per_node}-{s.tasks - 1}" if many else f"rank {s.gpus_per_node}"
        raise ConfigError(
            f"--tasks-per-node {s.tasks} is more than --gpus-per-node {s.gpus_per_node}: local {idle} of "
            f"each node would have no GPU; give --tasks-per-node {s.gpus_per_node} (one rank per GPU) or "
            f"--gpus-per-node {s.tasks}"
        )
    cpus = s.cores_per_node * s.hyperthreads if s.cores_per_node else None
    if cpus and s.tasks * (s.cpus_per_task or 1) > cpus:  # the scheduler cannot place it, or ranks share cores
        raise ConfigError(
            f"--tasks-per-node {s.tasks} x --cpus-per-task {s.cpus_per_task or 1} is more than a node's {cpus} "
            f"CPUs (--cores-per-node {s.cores_per_node} x --hyperthreads {s.hyperthreads}); give fewer tasks or "
            "CPUs per task, or the node's real --cores-per-node"
        )


def _validate_recipe(s: JobSpec) -> None:
    """The network, GPU request, --wrap placeholders, container image and job-time --env values."""
    if s.network_interface is not None and not INTERFACE.fullmatch(s.network_interface):
        raise ConfigError(
            f"--network-interface {s.network_interface!r}: give an interface or address/CIDR (ib0, 10.1.0.0/16)"
        )
    if s.srun_mpi is not None and not SRUN_MPI_NAME.fullmatch(s.srun_mpi):
        raise ConfigError(f"--srun-mpi {s.srun_mpi!r}: give auto or a plugin name from srun --mpi=list (e.g. pmix)")
    if s.gpu_request not in GPU_REQUESTS:
        raise ConfigError(f"--gpu-request {s.gpu_request!r} is not one of {', '.join(GPU_REQUESTS)}")
    _validate_node(s)
    if s.gpu_request == "task" and s.gpus_per_node and s.gpus_per_node != s.tasks:
        raise ConfigError(
            f"--gpu-request task gives each rank one GPU: --tasks-per-node {s.tasks} must equal "
            f"--gpus-per-node {s.gpus_per_node} (or --gpu-request total for one rank using them all)"
        )
    for word in s.wrap:
        for name in re.findall(r"\{([^{}]*)\}", word):
            if name == "array_index" and not s.array:
                raise ConfigError(f"--wrap {word!r}: {{array_index}} needs --array (e.g. --array 0-9)")
            if name not in (*WRAP_FIELDS, "array_index"):
                known = ", ".join("{" + f + "}" for f in (*WRAP_FIELDS, "array_index"))
                raise ConfigError(f"--wrap {word!r}: unknown placeholder {{{name}}}; known: {known}")
    if s.container and "://" in s.container and not URI.fullmatch(s.container):
        raise ConfigError(
            f"--container {s.container!r} is refused: give a local .sif path or docker://, library://, oras:// "
            "followed by letters, digits and ._/:@+- (e.g. docker://tensorflow/tensorflow:2.16.1-gpu)"
        )
    for key, value in s.env:
        try:
            pieces(value)
        except ConfigError as exc:
            raise ConfigError(f"{key}: {exc}") from None


def spec_fields() -> list[str]:
    """Names of the options a site profile may set."""
    return [f.name for f in fields(JobSpec) if f.name != "command"]
