"""The launch line of a batch job, one :class:`Launcher` record per MPI flavour, and its thread plan.

Pure: a spec in, argv words and script lines out. Sites differ in the program
that starts the ranks, not in what the ranks need: Slurm's ``srun``, Cray ALPS
``aprun`` (Theta), Cray PALS ``mpiexec`` (Polaris, Aurora), Open MPI's
``mpirun`` (ThetaGPU, clusters with Open MPI) and MPICH/Intel MPI's Hydra
``mpiexec``. Each record renders the same geometry: ranks, ranks per node,
CPUs per rank (``depth``) and binding.

Threads fill the node: ``--cpus-per-task`` when given, else the site's cores per
node x hyperthreads / ranks per node, else measured on a node when the job starts
(:func:`thread_lines`). Words holding ``$`` are :class:`Shell` words, written in
double quotes so that only mldist's own variables expand.

Example:
    >>> from mldist.launch.batch.spec import JobSpec
    >>> s = JobSpec(command=("python",), scheduler="pbs", nodes=2, tasks_per_node=4, cpus_per_task=8)
    >>> launch_argv(s)
    ['mpiexec', '-n', '8', '--ppn', '4', '--depth', '8', '--cpu-bind', 'depth']
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...base import envvalues
from .expand import pieces
from .schedulers import scheduler

if TYPE_CHECKING:
    from .spec import JobSpec


class Shell(str):
    """A word of mldist's own text that the shell expands (written as ``"..."``)."""

    __slots__ = ()


class Raw(str):
    """mldist's own text written as is (an array expansion that may give no word)."""

    __slots__ = ()


def _w(text: str) -> str:
    return Shell(text) if "$" in text else text


@dataclass(frozen=True)
class Plan:
    """The geometry every launch line renders.

    Args:
        nodes, tasks: nodes and ranks per node.
        depth: CPUs (hardware threads) per rank: a number or ``$MLDIST_CPUS_PER_TASK``.
        cores: physical cores per rank (Open MPI's ``PE``): a number or ``$MLDIST_CORES_PER_TASK``.
        hyperthreads: hardware threads used per core.
        gpus_per_node: GPUs per node.
        omp: aprun's ``OMP_NUM_THREADS`` value.
        nodefile: the variable naming the job's node file, if the scheduler has one.
        env: the job's variables (site profile and ``--env``; the last value of a name), which
            aprun passes on with ``-e`` as the ALPS guides do.
    """

    nodes: int
    tasks: int
    depth: str
    cores: str
    hyperthreads: int
    gpus_per_node: int
    omp: str
    nodefile: str | None
    env: tuple[tuple[str, str], ...] = ()

    @property
    def total(self) -> str:
        return str(self.nodes * self.tasks)


def plan(s: JobSpec, nodefile: str | None) -> Plan:
    """The launch geometry of ``s``."""
    t = s.threads
    depth = str(t) if t else envvalues.shell("$@CPUS_PER_TASK@")
    cores = str(max(1, t // s.hyperthreads)) if t else envvalues.shell("$@CORES_PER_TASK@")
    user_omp = dict(s.env).get("OMP_NUM_THREADS")
    omp = depth if user_omp is None else (user_omp if "$" not in user_omp else "$OMP_NUM_THREADS")
    env = tuple((k, v) for k, v in dict(s.env).items() if k != "OMP_NUM_THREADS")  # omp has it
    return Plan(s.nodes, s.tasks, depth, cores, s.hyperthreads, s.gpus_per_node, omp, nodefile, env)


def _srun(p: Plan) -> list[str]:
    argv = ["srun", "--kill-on-bad-exit=1", f"--nodes={p.nodes}", f"--ntasks={p.total}"]
    argv += [f"--ntasks-per-node={p.tasks}", _w(f"--cpus-per-task={p.depth}"), "--cpu-bind=cores"]
    return argv + (["--gpus-per-task=1"] if p.gpus_per_node and p.gpus_per_node == p.tasks else []) + [Raw(SRUN_MPI)]


def _aprun_env(key: str, value: str) -> str:
    """aprun's ``-e`` word for job variable ``key``: ``KEY=VALUE`` as is, or ``"KEY=$KEY"`` if it refers to others.

    A value with ``$NAME`` references was expanded once by its ``export`` line; ``-e`` passes
    that result on rather than expanding again. Plain values are written shlex-quoted.

    Example:
        >>> _aprun_env("KMP_BLOCKTIME", "0"), _aprun_env("A", "x y$$"), _aprun_env("B", "${HOME}/d")
        ('KMP_BLOCKTIME=0', 'A=x y$', 'B=$B')
    """
    parts = pieces(value)
    if any(is_var for is_var, _ in parts):
        return Shell(f"{key}=${key}")
    return f"{key}=" + "".join(text for _, text in parts)


def _aprun(p: Plan) -> list[str]:
    # ALPS exports no world size: the sizes travel as -e variables, and so do the job's own
    # (the Theta guide's aprun -e OMP_NUM_THREADS=.. -e KMP_BLOCKTIME=..), which the script also exports.
    argv = ["aprun", "-n", p.total, "-N", str(p.tasks), "-d", _w(p.depth), "-j", str(p.hyperthreads), "-cc", "depth"]
    sizes = ((envvalues.SIZE.name, p.total), (envvalues.LOCAL_SIZE.name, str(p.tasks)))
    for key, value in (*sizes, ("OMP_NUM_THREADS", p.omp)):
        argv += ["-e", _w(f"{key}={value}")]
    for key, value in p.env:
        argv += ["-e", _aprun_env(key, value)]
    return argv


def _pals(p: Plan) -> list[str]:
    return ["mpiexec", "-n", p.total, "--ppn", str(p.tasks), "--depth", _w(p.depth), "--cpu-bind", "depth"]


def _openmpi(p: Plan) -> list[str]:
    argv = ["mpirun", "-np", p.total, "--map-by", _w(f"ppr:{p.tasks}:node:PE={p.cores}"), "--bind-to", "core"]
    argv += ["--hostfile", Shell(f"${p.nodefile}")] if p.nodefile else []
    return [*argv, Raw('${mldist_forward[@]+"${mldist_forward[@]}"}')]


def _hydra(p: Plan) -> list[str]:
    argv = ["mpiexec", "-n", p.total, "-ppn", str(p.tasks)]
    return argv + (["-f", Shell(f"${p.nodefile}")] if p.nodefile else [])


#: Variables Open MPI's mpirun must be told to pass on (``-x``), besides the job's --env names.
FORWARD = (
    "PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "APPTAINER_CACHEDIR",
    "APPTAINERENV_PYTHONPATH",
    "OMP_NUM_THREADS",
    *(v.name for v in (envvalues.CPUS_PER_TASK, envvalues.JOB_DIR, envvalues.RUN_DIR, envvalues.ATTEMPT)),
    *(v.name for v in (envvalues.JOB_ID, envvalues.REQUEUE_MARK, envvalues.DECISION)),
)


def _forward_lines(s: JobSpec) -> list[str]:
    # Open MPI starts remote ranks with its own environment plus what -x names; -x of an unset
    # variable is an error, so the list is made when the job runs.
    names = " ".join(dict.fromkeys([*FORWARD, *(k for k, _ in s.env)]))
    return [
        "mldist_forward=()  # Open MPI passes on only the variables -x names",
        f'for v in {names}; do [ -n "${{!v+x}}" ] && mldist_forward+=(-x "$v"); done',
    ]


#: srun's MPI plugin option, chosen when the job runs (:func:`_srun_mpi_lines`); no word for the site default.
SRUN_MPI = '${mldist_srun_mpi[@]+"${mldist_srun_mpi[@]}"}'
#: Whether mpi4py's MPI is Open MPI (it speaks PMIx), asked without initialising MPI; exit 0 if so.
OPENMPI_PROBE = (
    "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
    "raise SystemExit('Open MPI' not in MPI.Get_library_version())"
)


def _srun_mpi_lines(s: JobSpec) -> list[str]:
    """``mldist_srun_mpi``: ``--srun-mpi`` (or the profile's ``srun_mpi``), else detected when the job runs.

    Detected: ``--mpi=pmix`` where Slurm offers PMIx and mpi4py's MPI is Open MPI (a PyPI Open MPI
    under Slurm's other plugins sees a world of one per rank); otherwise the site's MpiDefault
    (Cray MPICH, Intel MPI and MPICH builds speak PMI through it). In a container the probe
    would ask the host's Python: the site default stays unless ``--srun-mpi`` says otherwise.
    """
    if s.srun_mpi and s.srun_mpi != "auto":
        return [f"mldist_srun_mpi=({shlex.quote('--mpi=' + s.srun_mpi)})  # --srun-mpi"]
    if s.container:
        return ["mldist_srun_mpi=()  # srun's MPI plugin: the site default (a container: set --srun-mpi)"]
    return [
        "# srun's MPI plugin: PMIx where Slurm offers it and mpi4py's MPI is Open MPI, else the site default",
        "mldist_srun_mpi=()",
        f"if srun --mpi=list 2>&1 | grep -qw pmix && python3 -c {shlex.quote(OPENMPI_PROBE)} >/dev/null 2>&1; then",
        "  mldist_srun_mpi=(--mpi=pmix)",
        "fi",
        'echo "mldist: srun MPI plugin: ${mldist_srun_mpi[0]:-the site default}"',
    ]


@dataclass(frozen=True)
class Launcher:
    """One way to start the ranks.

    Args:
        name: the ``--launcher`` value.
        argv: the launch line's words before the rank command.
        setup: script lines the launch line needs (run after the environment is set).
        probe: argv prefix that runs a command on one compute node (the batch
            script may run elsewhere, as on ALPS service nodes); [] runs it in place.
        sites: where it is used, for the README table.
        steps: it starts steps inside the allocation on named nodes, as an elastic job's agent needs.
    """

    name: str
    argv: Callable[[Plan], list[str]]
    setup: Callable[[JobSpec], list[str]] = lambda s: []
    probe: tuple[str, ...] = ()
    sites: str = ""
    steps: bool = False


LAUNCHERS: dict[str, Launcher] = {
    r.name: r
    for r in (
        Launcher("srun", _srun, setup=_srun_mpi_lines, sites="Slurm: Alps, Frontier, Perlmutter, Saga", steps=True),
        Launcher("aprun", _aprun, probe=("aprun", "-n", "1", "-N", "1", "-cc", "none"), sites="Cobalt + ALPS: Theta"),
        Launcher("pals", _pals, sites="PBS Pro + Cray PALS: Polaris, Aurora"),
        Launcher("openmpi", _openmpi, setup=_forward_lines, sites="Open MPI mpirun: ThetaGPU, clusters"),
        Launcher("hydra", _hydra, sites="MPICH / Intel MPI Hydra mpiexec"),
    )
}


def launcher_name(s: JobSpec) -> str:
    """The launcher that starts the ranks: ``s.launcher``, else the scheduler's own.

    Example:
        >>> from mldist.launch.batch.spec import JobSpec
        >>> launcher_name(JobSpec(command=("x",), scheduler="cobalt")), launcher_name(JobSpec(command=("x",)))
        ('aprun', 'srun')
    """
    return s.launcher or scheduler(s.scheduler).launcher


def launch_argv(s: JobSpec) -> list[str]:
    """The launch line's words before the rank command."""
    return LAUNCHERS[launcher_name(s)].argv(plan(s, scheduler(s.scheduler).nodefile))


# Physical cores x hyperthreads ($1), within the CPUs this job may use on the node (nproc).
_MEASURE = (
    'c=$(lscpu -p=CORE,SOCKET 2>/dev/null | grep -v "^#" | sort -u | wc -l); a=$(nproc 2>/dev/null || echo 1); '
    '[ "$c" -gt 0 ] 2>/dev/null || c=$a; c=$((c * $1)); [ "$c" -le "$a" ] || c=$a; echo "$c"'
)


def thread_lines(s: JobSpec) -> list[str]:
    """Script lines that export ``OMP_NUM_THREADS`` and ``MLDIST_CPUS_PER_TASK`` (and cores per rank)."""
    launcher = LAUNCHERS[launcher_name(s)]
    t = s.threads
    if t:
        return [envvalues.shell(f"export OMP_NUM_THREADS={t} @CPUS_PER_TASK@={t}")]
    probe = " ".join(shlex.quote(a) for a in (*launcher.probe, "bash", "-c", _MEASURE, "mldist-cpus"))
    k, ht = s.tasks, s.hyperthreads
    exports = [
        f"export @CPUS_PER_TASK@=$((mldist_cpus / {k} > 0 ? mldist_cpus / {k} : 1))",
        f"export OMP_NUM_THREADS=$@CPUS_PER_TASK@ @CORES_PER_TASK@=$((@CPUS_PER_TASK@ / {ht} > 0 ? "
        f"@CPUS_PER_TASK@ / {ht} : 1))",
        f'echo "mldist: $mldist_cpus CPUs per node (measured): $@CPUS_PER_TASK@ threads for each of {k} '
        'ranks per node (--cpus-per-task sets them)"',
    ]
    return [
        f"mldist_cpus=$({probe} {ht})  # no --cpus-per-task: the node's cores are shared among its ranks",
        f'[ "${{mldist_cpus:-0}}" -gt 0 ] 2>/dev/null || mldist_cpus={k}',
        *(envvalues.shell(line) for line in exports),
    ]
