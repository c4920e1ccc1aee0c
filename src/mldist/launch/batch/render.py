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

from ...base import envvalues
from ...base.secrets import REDACTED, SECRET_SUFFIXES, SECRET_WORDS
from ...errors import REQUEUE_CODE
from .checks import check
from .launchers import LAUNCHERS, Raw, Shell, launch_argv, launcher_name, thread_lines
from .schedulers import Scheduler, scheduler
from .software import activate_lines, container_lines, container_prefix, env_lines, module_lines, source_lines
from .spec import JobSpec
from .staging import stage_lines, stage_prefix, unstage_lines

q = shlex.quote

# A trapped signal interrupts `wait` with 128+N; the traps set t=1 so that the loop waits
# again, which then gives the child's own status (bash keeps it until it is waited for). A
# later wait after the status was taken returns 127 ("$k$s" = 1127): the status already read
# stands. The first wait's 127 is the child's own (command not found) and fails the rank.
#
# Runs in every task: the user's command as "$@" with a per-rank log file. The
# wrapper stays (no exec) to forward USR1/TERM when the launcher signals only its
# direct child, and to turn the requeue code into a marker file plus exit 0: a
# rank that exits 75 first must not look like a failure to `srun
# --kill-on-bad-exit=1` (or mpiexec), which would kill the ranks still saving.
RANK_WRAPPER = envvalues.shell(
    'r="${OMPI_COMM_WORLD_RANK:-${PALS_RANKID:-${PMI_RANK:-${ALPS_APP_PE:-${SLURM_PROCID:-0}}}}}"; '
    'l="${OMPI_COMM_WORLD_LOCAL_RANK:-${PALS_LOCAL_RANKID:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-'
    '$((r % ${@LOCAL_SIZE@:-1}))}}}}"; '
    # The first $1 words (--wrap) get {rank}, {local_rank}, {job_id}, {job_dir}; quoted replacements are literal.
    'n=$1; shift; w=(); while [ "$n" -gt 0 ]; do a=$1; shift; n=$((n - 1)); a=${a//\\{rank\\}/"$r"}; '
    'a=${a//\\{local_rank\\}/"$l"}; a=${a//\\{job_id\\}/"${@JOB_ID@:-}"}; '
    'a=${a//\\{job_dir\\}/"$@JOB_DIR@"}; w+=("$a"); done; set -- ${w[@]+"${w[@]}"} "$@"; c=""; '
    """trap 't=1; [ -n "$c" ] && kill -USR1 "$c" 2>/dev/null' USR1; """
    """trap 't=1; [ -n "$c" ] && kill -TERM "$c" 2>/dev/null' TERM; """
    '"$@" >>"$@JOB_DIR@/rank-$r.log" 2>&1 & c=$!; '
    'code=0; t=1; k=0; while [ "$t" = 1 ]; do t=0; wait "$c"; s=$?; [ "$k$s" = 1127 ] && break; code=$s; k=1; done; '
    f'if [ "$code" -eq {REQUEUE_CODE} ] && [ -n "${{@REQUEUE_MARK@:-}}" ]; then '
    ': >"$@REQUEUE_MARK@.rank-$r" && exit 0; fi; '
    'exit "$code"'
)


def word(arg: str) -> str:
    """One argv word in the script: :class:`Shell` words in double quotes, :class:`Raw` as is, others quoted."""
    if isinstance(arg, Raw):
        return str(arg)
    return f'"{arg}"' if isinstance(arg, Shell) else q(arg)


def header(s: JobSpec, sched: Scheduler) -> list[str]:
    """Shebang, directives, and the variables every later line relies on."""
    lines = ["#!/bin/bash", *sched.directive_lines(s), "# Written by mldist submit.", "set -uo pipefail"]
    lines += ["umask 077  # what the job writes is owner-only (logs, records, outputs)"]
    lines += [sched.workdir] if sched.workdir else []
    # Until the ranks start, a save signal is only noted: bash's default for USR1 would end the script.
    lines += ["trap 'mldist_early_usr1=1' USR1"] if s.requeue else []
    job = [
        # The job's run directory: mldist.keras.RunLog writes metrics, plots and TensorBoard events here.
        'export @RUN_DIR@="$@JOB_DIR@/run"',
        'export @ATTEMPT@="${@ATTEMPT@:-${SLURM_RESTART_COUNT:-0}}"',
        f'job_id="${{{sched.job_id_var}:-local}}"',
        'export @JOB_ID@="$job_id"',
        'mkdir -p "$@JOB_DIR@"',
        # Ranks that exit with the requeue code leave a marker here (see RANK_WRAPPER).
        'export @REQUEUE_MARK@="$@JOB_DIR@/.requeue-$job_id-$@ATTEMPT@"',
        'rm -f -- "$@REQUEUE_MARK@".rank-*',
    ]
    return [
        *lines,
        f"export {envvalues.JOB_DIR.name}={q(s.output_dir)}",  # your folder: an @NAME@ in it stays as is
        *array_lines(s, sched),
        *(envvalues.shell(line) for line in job),
    ]


def array_lines(s: JobSpec, sched: Scheduler) -> list[str]:
    """For an array task: ``MLDIST_ARRAY_INDEX``, and ``MLDIST_JOB_DIR`` narrowed to ``array-INDEX``.

    Each task then has its own rank logs, run directory, environment record and ``{job_dir}``.
    """
    if not s.array:
        return []
    return [
        f'export {envvalues.ARRAY_INDEX.name}="{sched.array_index}"',
        envvalues.shell('export @JOB_DIR@="$@JOB_DIR@/array-$@ARRAY_INDEX@"  # this array task\'s own directory'),
    ]


def wrap_word(text: str) -> str:
    """A ``--wrap`` word: ``{array_index}`` becomes the task's index now, the rest stays for the rank wrapper.

    Example:
        >>> print(wrap_word("-o {job_dir}/a{array_index}-r{rank}"))
        '-o {job_dir}/a'"$MLDIST_ARRAY_INDEX"'-r{rank}'
    """
    parts = text.split("{array_index}")
    if len(parts) == 1:
        return q(text)
    return envvalues.shell('"$@ARRAY_INDEX@"').join(q(p) if p else "" for p in parts)


def _any_case(text: str) -> str:
    # POSIX sed has no case-insensitive flag: TOKEN -> [Tt][Oo][Kk][Ee][Nn].
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in text)


def redaction_sed() -> list[str]:
    """The ``sed`` programs that hide secrets in the environment record (``sed -E -e P1 -e P2 ...``).

    The same rule as ``mldist env`` (``base.secrets.redact``), applied by the shell so a
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
    py = " ".join(word(a) for a in [*container_prefix(s), "python3"])  # the tasks' python
    sed = [f"  -e {q(program)}" for program in redaction_sed()]
    return [
        "{",
        envvalues.shell('  echo "# job $job_id attempt $@ATTEMPT@ on $(hostname) at $(date -u +%FT%TZ)"'),
        '  echo "## modules"; command -v module >/dev/null 2>&1 && module list 2>&1',
        f'  echo "## python"; {py} -c "import sys; print(sys.executable, sys.version)"',
        f'  echo "## pip freeze"; {py} -m pip freeze || echo "(no pip here)"',
        f'  echo "## mldist env"; {py} -m mldist env --json --no-tensorflow',
        "} 2>&1 | sed -E \\",
        *(line + " \\" for line in sed[:-1]),
        sed[-1] + envvalues.shell(' >"$@JOB_DIR@/environment-$job_id.txt"'),
    ]


def decision_lines(s: JobSpec) -> list[str]:
    """Lines that decide the engine once, for every rank, and export it as ``MLDIST_DECISION``.

    Decided here, on the job's first node after its modules, environment and container are in place,
    not when the job is submitted: the login node that submits it may show no GPU, and another
    Python, mpi4py or Keras backend than the ranks get (:mod:`mldist.launch.batch.decided`). Where
    the job's python3 cannot decide (no mldist, a bad setting), each rank decides for itself; so does a
    rank whose facts differ (under aprun the script runs on a service node, not among the ranks).
    """
    py = " ".join(word(a) for a in [*container_prefix(s), "python3"])  # the tasks' python
    decide = f"{py} -m mldist.launch.batch.decided {s.total_tasks} {q(launcher_name(s))}"
    return [
        "# The engine, decided once here for every rank: each takes it where its facts are these (mldist env).",
        f"if mldist_decision=$({decide} 2>/dev/null); then",
        envvalues.shell('  export @DECISION@="$mldist_decision"'),
        "else",
        envvalues.shell("  unset @DECISION@"),
        '  echo "mldist: no engine decision to hand the ranks (${mldist_decision:-python3 has no mldist here}); '
        'each decides for itself"',
        "fi",
    ]


def hook_lines(s: JobSpec) -> list[str]:
    """The ranks' start-up hook first on ``PYTHONPATH`` (:mod:`mldist.base.joined`): Keras's and the common
    variables per rank, and a note on whether each rank joined a group. Not in a container, whose mldist
    may be another one (or none)."""
    if s.container:
        return []
    return [
        "# The ranks' start-up hook: Keras's variables per rank, and whether each joined a group.",
        "mldist_where='from mldist.base.joined import hook_folder; print(hook_folder())'",
        'if mldist_hook=$(python3 -c "$mldist_where" 2>/dev/null); then',
        '  export PYTHONPATH="$mldist_hook${PYTHONPATH:+:$PYTHONPATH}"',
        "fi",
        envvalues.shell('rm -f -- "$@RUN_DIR@"/progress/group-*'),
    ]


def formed_lines(s: JobSpec) -> list[str]:
    """After a step that succeeded, where the job's python3 has mldist: say so when its ranks never
    formed a group (an error with ``MLDIST_REQUIRE_GROUP=1``)."""
    if s.container or s.min_nodes is not None:  # an elastic job's rounds have fewer ranks than it started with
        return []
    check = (
        envvalues.shell('python3 -m mldist.launch.batch.formed "$@RUN_DIR@/progress" ') + f"{s.total_tasks} || code=1"
    )
    # Only where the job's python3 has mldist (it found the hook): the ranks may run another one.
    return [f'if [ "$code" -eq 0 ] && [ -n "${{mldist_hook:-}}" ]; then {check}; fi']


def launch_step(s: JobSpec) -> list[str]:
    """Start the ranks in the background and wait for them, relaying TERM/INT (and USR1 with requeue).

    The rank wrapper gets the number of ``--wrap`` words first, then those words, the container
    prefix and the command.
    """
    words = [*elastic_agent(s), *launch_argv(s), "bash", "-c", RANK_WRAPPER, "mldist-rank", str(len(s.wrap))]
    words += [Raw(wrap_word(w)) for w in s.wrap]
    run = " ".join(word(a) for a in [*words, *container_prefix(s), *stage_prefix(s), *s.command])
    lines = [
        f"{run} &",
        "child=$!",
        "trap 't=1; kill -TERM \"$child\" 2>/dev/null' TERM INT",
    ]
    if s.requeue:
        lines.append('trap \'t=1; echo "mldist: USR1: asking the workers to save and exit"; kill -USR1 "$child"\' USR1')
    # A trapped signal interrupts wait: wait again until the step's own status is in (see RANK_WRAPPER).
    lines.append(
        'code=0; t=1; k=0; while [ "$t" = 1 ]; do t=0; wait "$child"; s=$?; '
        '[ "$k$s" = 1127 ] && break; code=$s; k=1; done'
    )
    if not s.requeue:
        return lines
    # USR1 before the ranks started (a grace period longer than the time left): nothing ran, nothing to save.
    return [
        'if [ -n "${mldist_early_usr1:-}" ]; then',
        f'  echo "mldist: USR1 came before the workers started: requeueing without starting them"; code={REQUEUE_CODE}',
        "else",
        *("  " + line for line in lines),
        "fi",
    ]


def elastic_agent(s: JobSpec) -> list[str]:
    """The words that hand an elastic job's srun line to :mod:`mldist.launch.batch.agent` ([] otherwise)."""
    if s.min_nodes is None:
        return []
    agent = ["python3", "-m", "mldist.launch.batch.agent", "--min-nodes", str(s.min_nodes)]
    return [*agent, "--tasks-per-node", str(s.tasks), *(["--requeue"] if s.requeue else []), "--"]


def elastic_check(s: JobSpec) -> list[str]:
    """An elastic job stops at once, in one line, where the job's python3 has no mldist to run the agent."""
    if s.min_nodes is None:
        return []
    return [
        "if ! python3 -c 'import mldist.launch.batch.agent' 2>/dev/null; then",
        "  echo \"mldist: --min-nodes: the job's python3 ($(command -v python3)) has no mldist to re-form the world; "
        'give --venv or --conda with mldist installed" >&2',
        "  exit 1",
        "fi",
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
        envvalues.shell('for mark in "$@REQUEUE_MARK@".rank-*; do'),
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
    """The complete batch script for ``s.scheduler`` (after the checks of :func:`.checks.check`).

    Args:
        s: the job.
    """
    sched = scheduler(check(s).scheduler)
    timer = bool(s.requeue and sched.own_timer and s.time_seconds)
    lines = header(s, sched)
    # The save timer starts first, so module loads and the record do not eat into the grace period.
    lines += own_timer(s) if timer else []
    lines += [*module_lines(s), *source_lines(s), *activate_lines(s), *thread_lines(s), *env_lines(s)]
    lines += [*LAUNCHERS[launcher_name(s)].setup(s), *container_lines(s, word)]
    # After the image pull, which needs the proxies a profile unsets for the ranks' gRPC.
    lines += ["unset " + " ".join(s.unset)] if s.unset else []
    lines += environment_record(s)
    lines += decision_lines(s)
    lines += hook_lines(s)
    lines += elastic_check(s)
    lines += stage_lines(s, word)
    lines += launch_step(s)
    lines += unstage_lines(s, word)
    lines += formed_lines(s)
    lines += ['kill "$watcher" 2>/dev/null'] if timer else []
    return "\n".join(lines + requeue_tail(s, sched))
