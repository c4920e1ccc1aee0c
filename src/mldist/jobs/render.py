"""Batch scripts for Slurm, PBS Pro and Cobalt, rendered from a JobSpec.

Pure: a spec in, script text out. Every value in the script body is quoted
with ``shlex.quote``; the user's command reaches each task as ``"$@"`` of a
fixed wrapper, so nothing the user typed is ever parsed as shell code.

Example:
    >>> from mldist.jobs.spec import JobSpec
    >>> text = render(JobSpec(command=("python", "train.py"), nodes=2))
    >>> "#SBATCH --nodes=2" in text and "srun --kill-on-bad-exit=1" in text
    True
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable

from ..errors import REQUEUE_CODE, ConfigError
from .spec import JobSpec, hms

q = shlex.quote

# Runs in every task: the user's command as "$@" with a per-rank log file. The
# wrapper stays (no exec) to forward USR1/TERM when the launcher signals only its
# direct child, and to turn the requeue code into a marker file plus exit 0: a
# rank that exits 75 first must not look like a failure to `srun
# --kill-on-bad-exit=1` (or mpiexec), which would kill the ranks still saving.
RANK_WRAPPER = (
    'r="${OMPI_COMM_WORLD_RANK:-${PALS_RANKID:-${PMI_RANK:-${ALPS_APP_PE:-${SLURM_PROCID:-0}}}}}"; c=""; '
    """trap '[ -n "$c" ] && kill -USR1 "$c" 2>/dev/null' USR1; """
    """trap '[ -n "$c" ] && kill -TERM "$c" 2>/dev/null' TERM; """
    '"$@" >>"$MLDIST_JOB_DIR/rank-$r.log" 2>&1 & c=$!; '
    'code=0; wait "$c" || code=$?; '
    'while kill -0 "$c" 2>/dev/null; do code=0; wait "$c" || code=$?; done; '
    f'if [ "$code" -eq {REQUEUE_CODE} ] && [ -n "${{MLDIST_REQUEUE_MARK:-}}" ]; then '
    ': >"$MLDIST_REQUEUE_MARK.rank-$r" && exit 0; fi; '
    'exit "$code"'
)


def _slurm_time(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    return f"{days}-{hms(rest)}" if days else hms(rest)


def _slurm_directives(s: JobSpec) -> list[str]:
    out = s.output_dir + "/job-%j.out"
    d = [f"--job-name={s.job_name}", f"--nodes={s.nodes}", f"--ntasks-per-node={s.tasks}"]
    # sbatch splits directive words at blanks, strips quotes and cuts at '#'; double quotes
    # protect all of these (the spec refuses '"' and '\\' in the path).
    d.append(f'--output="{out}"' if any(c in out for c in " \t'#") else f"--output={out}")
    d.append("--open-mode=append")  # a requeued job appends to its log
    if s.cpus_per_task:
        d.append(f"--cpus-per-task={s.cpus_per_task}")
    if s.gpus_per_node:
        d.append(f"--gpus-per-node={s.gpus_per_node}")
    if s.time_seconds:
        d.append(f"--time={_slurm_time(s.time_seconds)}")
    for flag, value in (
        ("--mem", s.mem),
        ("--dependency", s.dependency),
        ("--array", s.array),
        ("--account", s.account),
        ("--partition", s.queue),
        ("--constraint", s.constraint),
    ):
        if value:
            d.append(f"{flag}={value}")
    if s.requeue:
        d += ["--requeue", f"--signal=B:USR1@{s.grace}"]
    return [f"#SBATCH {x}" for x in (*d, *s.directives)]


def _pbs_directives(s: JobSpec) -> list[str]:
    if s.constraint:
        raise ConfigError("--constraint is Slurm's; on PBS use --directive '-l select=...' resources")
    cpus = s.tasks * (s.cpus_per_task or 1)
    select = f"select={s.nodes}:ncpus={cpus}:mpiprocs={s.tasks}"
    if s.gpus_per_node:
        select += f":ngpus={s.gpus_per_node}"
    if s.mem:
        select += f":mem={s.mem.lower().removesuffix('b')}b"
    d = [f"-N {s.job_name}", f"-l {select}", "-l place=scatter", f"-o {s.output_dir}/job.out", "-j oe"]
    if s.time_seconds:
        d.append(f"-l walltime={hms(s.time_seconds)}")
    if s.queue:
        d.append(f"-q {s.queue}")
    if s.account:
        d.append(f"-A {s.account}")
    if s.dependency:
        d.append(f"-W depend={s.dependency}")
    if s.array:
        d.append(f"-J {s.array}")
    return [f"#PBS {x}" for x in (*d, *s.directives)]


def _cobalt_directives(s: JobSpec) -> list[str]:
    for value, name in ((s.array, "--array"), (s.mem, "--mem"), (s.gpus_per_node, "--gpus-per-node")):
        if value:
            raise ConfigError(f"{name} is not supported by Cobalt")
    d = [f"-n {s.nodes}", f"-O {s.output_dir}/job"]
    if s.time_seconds:
        d.append(f"-t {math.ceil(s.time_seconds / 60)}")
    if s.queue:
        d.append(f"-q {s.queue}")
    if s.account:
        d.append(f"-A {s.account}")
    if s.constraint:
        d.append(f"--attrs {s.constraint}")
    if s.dependency:
        d.append(f"--dependencies {s.dependency}")
    return [f"#COBALT {x}" for x in (*d, *s.directives)]


def _slurm_launch(s: JobSpec) -> list[str]:
    argv = ["srun", "--kill-on-bad-exit=1", f"--nodes={s.nodes}", f"--ntasks={s.total_tasks}"]
    argv.append(f"--ntasks-per-node={s.tasks}")
    if s.cpus_per_task:
        argv += [f"--cpus-per-task={s.cpus_per_task}", "--cpu-bind=cores"]
    if s.gpus_per_node and s.gpus_per_node == s.tasks:
        argv.append("--gpus-per-task=1")
    return argv


def _pbs_launch(s: JobSpec) -> list[str]:
    depth = str(s.cpus_per_task or 1)
    return [
        "mpiexec",
        "-n",
        str(s.total_tasks),
        "--ppn",
        str(s.tasks),
        "--depth",
        depth,
        "--cpu-bind",
        "depth",
    ]


def _cobalt_launch(s: JobSpec) -> list[str]:
    depth = str(s.cpus_per_task or 1)
    argv = ["aprun", "-n", str(s.total_tasks), "-N", str(s.tasks), "-d", depth, "-j", str(s.hyperthreads)]
    argv += ["-cc", "depth"]
    # aprun exports no world size; mldist.init() reads these instead.
    for key, value in (
        ("MLDIST_SIZE", s.total_tasks),
        ("MLDIST_LOCAL_SIZE", s.tasks),
        ("OMP_NUM_THREADS", dict(s.env).get("OMP_NUM_THREADS", depth)),  # the user's --env wins
    ):
        argv += ["-e", f"{key}={value}"]
    return argv


#: Per scheduler: directives, task launcher, job id variable, work dir, requeue action.
SCHEDULER_TABLE: dict[str, tuple[Callable[[JobSpec], list[str]], Callable[[JobSpec], list[str]], str, str, str]] = {
    "slurm": (_slurm_directives, _slurm_launch, "SLURM_JOB_ID", "", 'scontrol requeue "$SLURM_JOB_ID"'),
    "pbs": (
        _pbs_directives,
        _pbs_launch,
        "PBS_JOBID",
        'cd "$PBS_O_WORKDIR"',
        'qsub -v MLDIST_ATTEMPT="$((MLDIST_ATTEMPT + 1))" "$MLDIST_JOB_DIR/job.sh"',
    ),
    "cobalt": (
        _cobalt_directives,
        _cobalt_launch,
        "COBALT_JOBID",
        "",
        'qsub --env MLDIST_ATTEMPT="$((MLDIST_ATTEMPT + 1))" "$MLDIST_JOB_DIR/job.sh"',
    ),
}


def _not_an_option(path: str) -> str:
    # A relative path like "-venv" would be read as an option by source/apptainer.
    return "./" + path if path.startswith("-") else path


def _environment(s: JobSpec) -> list[str]:
    lines = []
    if s.unset:
        lines.append("unset " + " ".join(s.unset))
    if s.modules:
        lines += [
            "if ! command -v module >/dev/null 2>&1; then",
            '  for f in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh; do [ -r "$f" ] && . "$f"; done',
            "fi",
            "module purge",
            *(f"module load {q(m)}" for m in s.modules),
        ]
    if s.venv:
        lines.append(f"source {q(_not_an_option(s.venv.rstrip('/') + '/bin/activate'))}")
    if s.conda:
        lines += ['eval "$(conda shell.bash hook)"', f"conda activate {q(s.conda)}"]
    threads = str(s.cpus_per_task or 1)
    lines += [f"export OMP_NUM_THREADS={threads} MLDIST_CPUS_PER_TASK={threads}"]
    lines += [f"export {k}={q(v)}" for k, v in s.env]
    if s.container:
        lines.append('export APPTAINER_CACHEDIR="${APPTAINER_CACHEDIR:-${TMPDIR:-/tmp}/apptainer-cache-$(id -u)}"')
    return lines


def _container_prefix(s: JobSpec) -> list[str]:
    if not s.container:
        return []
    argv = ["apptainer", "exec"] + (["--nv"] if s.gpus_per_node else [])
    for path in ("$PWD", "$MLDIST_JOB_DIR", *s.binds):
        argv += ["--bind", path]
    return [*argv, _not_an_option(s.container)]


def _word(arg: str) -> str:
    # $PWD and $MLDIST_JOB_DIR are the only words meant to expand.
    return f'"{arg}"' if arg in ("$PWD", "$MLDIST_JOB_DIR") else q(arg)


def render(s: JobSpec) -> str:
    """The complete batch script for ``s.scheduler``.

    Args:
        s: the job.
    """
    directives, launch, id_var, workdir, resubmit = SCHEDULER_TABLE[s.scheduler]
    container = _container_prefix(s)
    run = " ".join(_word(a) for a in [*launch(s), "bash", "-c", RANK_WRAPPER, "mldist-rank", *container])
    command = " ".join(q(a) for a in s.command)
    py = " ".join(_word(a) for a in [*container, "python3"])  # the tasks' python, in the container if any
    lines = ["#!/bin/bash", *directives(s), "# Written by mldist submit.", "set -uo pipefail"]
    lines += [workdir] if workdir else []
    lines += [
        f"export MLDIST_JOB_DIR={q(s.output_dir)}",
        'export MLDIST_ATTEMPT="${MLDIST_ATTEMPT:-${SLURM_RESTART_COUNT:-0}}"',
        f'job_id="${{{id_var}:-local}}"',
        'mkdir -p "$MLDIST_JOB_DIR"',
        # Ranks that exit with the requeue code leave a marker here (see RANK_WRAPPER).
        'export MLDIST_REQUEUE_MARK="$MLDIST_JOB_DIR/.requeue-$job_id-$MLDIST_ATTEMPT"',
        'rm -f -- "$MLDIST_REQUEUE_MARK".rank-*',
        *_environment(s),
        "{",
        '  echo "# job $job_id attempt $MLDIST_ATTEMPT on $(hostname) at $(date -u +%FT%TZ)"',
        '  echo "## modules"; command -v module >/dev/null 2>&1 && module list 2>&1',
        f'  echo "## python"; {py} -c "import sys; print(sys.executable, sys.version)"',
        f'  echo "## pip freeze"; {py} -m pip freeze',
        f'  echo "## mldist env"; {py} -m mldist env --json --no-tensorflow',
        '} >"$MLDIST_JOB_DIR/environment-$job_id.txt" 2>&1',
    ]
    timer = s.requeue and s.scheduler != "slurm" and s.time_seconds
    if timer:
        # PBS and Cobalt send no early signal: arm our own, --grace before the limit.
        delay = int(s.time_seconds or 0) - s.grace
        lines.append(
            f'( trap \'kill "$nap" 2>/dev/null; exit 0\' TERM; sleep {delay} & nap=$!; wait "$nap"; '
            "kill -USR1 $$ ) & watcher=$!"
        )
    lines += [
        f"{run} {command} &",
        "child=$!",
        "trap 'kill -TERM \"$child\" 2>/dev/null' TERM INT",
    ]
    if s.requeue:
        lines.append('trap \'echo "mldist: USR1: asking the workers to save and exit"; kill -USR1 "$child"\' USR1')
    lines += [
        'code=0; wait "$child" || code=$?',
        # A trapped signal interrupts wait; keep waiting until the step really ended.
        'while kill -0 "$child" 2>/dev/null; do code=0; wait "$child" || code=$?; done',
    ]
    if timer:
        lines.append('kill "$watcher" 2>/dev/null')
    lines += [
        'for mark in "$MLDIST_REQUEUE_MARK".rank-*; do',
        f'  if [ "$code" -eq 0 ] && [ -e "$mark" ]; then code={REQUEUE_CODE}; fi',
        "done",
    ]
    if s.requeue:
        lines += [
            f'if [ "$code" -eq {REQUEUE_CODE} ]; then',
            '  echo "mldist: workers saved and asked to be requeued (exit 75)"',
            f"  {resubmit}",
            "fi",
        ]
    lines += ['echo "mldist: job step ended with exit code $code"', 'exit "$code"', ""]
    return "\n".join(lines)
