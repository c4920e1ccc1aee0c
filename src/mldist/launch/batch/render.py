"""Batch scripts for Slurm, PBS Pro and Cobalt, rendered from a JobSpec.

Pure: a spec in, script text out. Every value in the script body is quoted
with ``shlex.quote``; the user's command reaches each task as ``"$@"`` of a
fixed wrapper, so nothing the user typed is ever parsed as shell code.

Everything the job writes is owner-only: the script sets ``umask 077`` before it
writes anything (job directory, rank logs, environment record, and whatever the
user's command creates; a program that wants group-readable output sets its own
umask, e.g. ``os.umask(0o027)``). 077 already hides everything from group and
others, so it never widens what a usable umask allows. The environment record
is passed through a fixed ``sed`` program that hides the values of secret-looking
variables and the credentials in URLs (see :func:`redaction_sed`).

Example:
    >>> from mldist.launch.batch.spec import JobSpec
    >>> text = render(JobSpec(command=("python", "train.py"), nodes=2))
    >>> "#SBATCH --nodes=2" in text and "srun --kill-on-bad-exit=1" in text
    True
"""

from __future__ import annotations

import shlex

from ...errors import REQUEUE_CODE
from ...placement.resources import REDACTED, SECRET_SUFFIXES, SECRET_WORDS
from .schedulers import Scheduler, scheduler
from .spec import JobSpec

q = shlex.quote

# A trapped signal interrupts `wait` with 128+N; the traps set t=1 so that the loop waits
# again, which then gives the child's own status (bash keeps it until it is waited for). A
# wait after the status was taken returns 127: the status already read stands.
#
# Runs in every task: the user's command as "$@" with a per-rank log file. The
# wrapper stays (no exec) to forward USR1/TERM when the launcher signals only its
# direct child, and to turn the requeue code into a marker file plus exit 0: a
# rank that exits 75 first must not look like a failure to `srun
# --kill-on-bad-exit=1` (or mpiexec), which would kill the ranks still saving.
RANK_WRAPPER = (
    'r="${OMPI_COMM_WORLD_RANK:-${PALS_RANKID:-${PMI_RANK:-${ALPS_APP_PE:-${SLURM_PROCID:-0}}}}}"; c=""; '
    """trap 't=1; [ -n "$c" ] && kill -USR1 "$c" 2>/dev/null' USR1; """
    """trap 't=1; [ -n "$c" ] && kill -TERM "$c" 2>/dev/null' TERM; """
    '"$@" >>"$MLDIST_JOB_DIR/rank-$r.log" 2>&1 & c=$!; '
    'code=0; t=1; while [ "$t" = 1 ]; do t=0; wait "$c"; s=$?; [ "$s" -eq 127 ] && break; code=$s; done; '
    f'if [ "$code" -eq {REQUEUE_CODE} ] && [ -n "${{MLDIST_REQUEUE_MARK:-}}" ]; then '
    ': >"$MLDIST_REQUEUE_MARK.rank-$r" && exit 0; fi; '
    'exit "$code"'
)


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


def header(s: JobSpec, sched: Scheduler) -> list[str]:
    """Shebang, directives, and the variables every later line relies on."""
    lines = ["#!/bin/bash", *sched.directive_lines(s), "# Written by mldist submit.", "set -uo pipefail"]
    lines += ["umask 077  # what the job writes is owner-only (logs, records, outputs)"]
    lines += [sched.workdir] if sched.workdir else []
    return [
        *lines,
        f"export MLDIST_JOB_DIR={q(s.output_dir)}",
        # The job's run directory: mldist.keras.RunLog writes metrics, plots and TensorBoard events here.
        'export MLDIST_RUN_DIR="$MLDIST_JOB_DIR/run"',
        'export MLDIST_ATTEMPT="${MLDIST_ATTEMPT:-${SLURM_RESTART_COUNT:-0}}"',
        f'job_id="${{{sched.job_id_var}:-local}}"',
        'mkdir -p "$MLDIST_JOB_DIR"',
        # Ranks that exit with the requeue code leave a marker here (see RANK_WRAPPER).
        'export MLDIST_REQUEUE_MARK="$MLDIST_JOB_DIR/.requeue-$job_id-$MLDIST_ATTEMPT"',
        'rm -f -- "$MLDIST_REQUEUE_MARK".rank-*',
    ]


def _any_case(text: str) -> str:
    # POSIX sed has no case-insensitive flag: TOKEN -> [Tt][Oo][Kk][Ee][Nn].
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in text)


def redaction_sed() -> list[str]:
    """The ``sed`` programs that hide secrets in the environment record (``sed -E -e P1 -e P2 ...``).

    The same rule as ``mldist env`` (``placement.resources.redact``), applied by the shell so a
    record stays clean even when the job's own mldist is older or missing: credentials in URLs
    (``http://<redacted>@proxy:3128``), then JSON members ``"NAME": "..."`` and ``NAME=...`` of
    secret-looking names (``mldist env --json``, plain ``mldist env``, ``env``). ``pkg==1.0``
    lines of ``pip freeze`` (e.g. ``google-auth==2.0``) are left alone.
    """
    name_char = "[A-Za-z0-9_]"
    words = "|".join(_any_case(w) for w in SECRET_WORDS)
    suffixes = "|".join(_any_case(x) for x in SECRET_SUFFIXES)
    name = f"({name_char}*({words}){name_char}*|{name_char}*({suffixes}))"
    json_string = r'"([^"\\]|\\.)*"'
    value = r'("([^"\\]|\\.)*"?|[^="][^"]*|$)'  # quoted, or bare up to a quote, or nothing at the end
    return [
        rf's#([A-Za-z][A-Za-z0-9+.-]*://)[^/[:space:]"]*@#\1{REDACTED}@#g',
        rf's#"{name}": {json_string}#"\1": "{REDACTED}"#g',
        rf"s#(^|[^A-Za-z0-9_]){name}={value}#\1\2={REDACTED}#g",
    ]


def environment_record(s: JobSpec) -> list[str]:
    """Lines that write modules, Python, ``pip freeze`` and ``mldist env`` to ``environment-JOB.txt``.

    Written through :func:`redaction_sed`, owner-only (the script's umask).
    """
    py = " ".join(_word(a) for a in [*_container_prefix(s), "python3"])  # the tasks' python
    sed = [f"  -e {q(program)}" for program in redaction_sed()]
    return [
        "{",
        '  echo "# job $job_id attempt $MLDIST_ATTEMPT on $(hostname) at $(date -u +%FT%TZ)"',
        '  echo "## modules"; command -v module >/dev/null 2>&1 && module list 2>&1',
        f'  echo "## python"; {py} -c "import sys; print(sys.executable, sys.version)"',
        f'  echo "## pip freeze"; {py} -m pip freeze',
        f'  echo "## mldist env"; {py} -m mldist env --json --no-tensorflow',
        "} 2>&1 | sed -E \\",
        *(line + " \\" for line in sed[:-1]),
        sed[-1] + ' >"$MLDIST_JOB_DIR/environment-$job_id.txt"',
    ]


def launch_step(s: JobSpec, sched: Scheduler) -> list[str]:
    """Start the tasks in the background and wait for them, relaying TERM/INT (and USR1 with requeue)."""
    words = [*sched.launch(s), "bash", "-c", RANK_WRAPPER, "mldist-rank", *_container_prefix(s)]
    run = " ".join(_word(a) for a in words)
    lines = [
        f"{run} {' '.join(q(a) for a in s.command)} &",
        "child=$!",
        "trap 't=1; kill -TERM \"$child\" 2>/dev/null' TERM INT",
    ]
    if s.requeue:
        lines.append('trap \'t=1; echo "mldist: USR1: asking the workers to save and exit"; kill -USR1 "$child"\' USR1')
    # A trapped signal interrupts wait: wait again until the step's own status is in (see RANK_WRAPPER).
    return [
        *lines,
        'code=0; t=1; while [ "$t" = 1 ]; do t=0; wait "$child"; s=$?; [ "$s" -eq 127 ] && break; code=$s; done',
    ]


def own_timer(s: JobSpec) -> list[str]:
    """For schedulers that send no early signal: USR1 to the script ``grace`` seconds before the limit."""
    delay = int(s.time_seconds or 0) - s.grace
    return [
        f'( trap \'kill "$nap" 2>/dev/null; exit 0\' TERM; sleep {delay} & nap=$!; wait "$nap"; '
        "kill -USR1 $$ ) & watcher=$!"
    ]


def requeue_tail(s: JobSpec, sched: Scheduler) -> list[str]:
    """Turn rank markers back into exit code 75, requeue on it (with ``--requeue``), exit with the step's code."""
    lines = [
        'for mark in "$MLDIST_REQUEUE_MARK".rank-*; do',
        f'  if [ "$code" -eq 0 ] && [ -e "$mark" ]; then code={REQUEUE_CODE}; fi',
        "done",
    ]
    if s.requeue:
        lines += [
            f'if [ "$code" -eq {REQUEUE_CODE} ]; then',
            '  echo "mldist: workers saved and asked to be requeued (exit 75)"',
            f"  {sched.resubmit}",
            "fi",
        ]
    return [*lines, 'echo "mldist: job step ended with exit code $code"', 'exit "$code"', ""]


def render(s: JobSpec) -> str:
    """The complete batch script for ``s.scheduler``.

    Args:
        s: the job.
    """
    sched = scheduler(s.scheduler)
    timer = bool(s.requeue and sched.own_timer and s.time_seconds)
    lines = [*header(s, sched), *_environment(s), *environment_record(s)]
    lines += own_timer(s) if timer else []
    lines += launch_step(s, sched)
    lines += ['kill "$watcher" 2>/dev/null'] if timer else []
    return "\n".join(lines + requeue_tail(s, sched))
