"""The launcher-worker contract: every ``MLDIST_*`` variable mldist reads or writes, in one table.

Each variable is one :class:`~mldist.base.envparse.Setting` here: its name, its default, its parser,
what it accepts, a one-line doc and who sets it (you, ``mldist run`` for its workers, the job script
of ``mldist submit``). Launchers write the names from this table (``{envvalues.RANK.name: "0"}``),
workers read through it (``envvalues.RESTART.read(env)``): no other module spells an ``MLDIST_*``
name (tests/test_layout.py scans for one). ``Setting.read`` gives the value; a value the parser
refuses raises one :class:`~mldist.errors.ConfigError` line that names the variable, the value and
the fix. An empty or blank value counts as unset (``export MLDIST_PLOT=`` in a batch script).

:data:`WORKER_SETTINGS` lists the ones the workers read as a yes/no, a count or seconds, so that
``mldist run`` can refuse a bad one before it starts any worker (:func:`check`), ``mldist.init()``
in a worker started some other way (a bare ``mpirun``, ``srun``) refuses it before any side effect,
and ``mldist env`` names it. :data:`ALL` is the whole table.

Example:
    >>> REQUIRE_GROUP.read({"MLDIST_REQUIRE_GROUP": "Yes"}), PLOT.read({}), COLLECTIVE_TIMEOUT.read({})
    (True, True, 600.0)
    >>> problems({"MLDIST_PORT_BASE": "70000"})
    ["MLDIST_PORT_BASE='70000' is not a port from 1024 to 53535: set it to one (default 20000), or unset it"]
    >>> RESTART.read({}), RANK.by, RUN_DIR.name
    (0, ('launcher',), 'MLDIST_RUN_DIR')
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from .envparse import (
    BATCH,
    LAUNCHER,
    USER,
    WORKER,
    Setting,
    count,
    flag,
    given,
    items,
    percent,
    positive_seconds,
    seconds,
    whole,
    yes_no,
)
from .envparse import FALSE as FALSE  # the words of a no: the start-up hook spells them too
from .envparse import TRUE as TRUE

#: The prefix of every name here (what a launcher forwards to remote ranks, what ``mldist env`` lists).
PREFIX = "MLDIST_"
_RUN = (USER, LAUNCHER)


# What you set (or mldist run's flags set for you), read as yes/no, counts and seconds.
PLOT = flag(
    "MLDIST_PLOT",
    True,
    on="RunLog draws metrics.png",
    off="no plot",
    doc="`0`: RunLog draws no metrics.png on rank 0 when the script does not say (matplotlib: about a second)",
)
REQUIRE_GROUP = flag(
    "MLDIST_REQUIRE_GROUP",
    False,
    on="a run whose workers never formed a group fails",
    off="it is a note",
    doc="`1` (`--require-group`): a run whose workers never formed a group exits 1",
    by=_RUN,
)
HOOK = flag(
    "MLDIST_HOOK",
    True,
    on="the start-up hook runs in the workers",
    off="no hook",
    doc="`0`: no start-up hook in the workers (no never-formed line; batch ranks then get no Keras variables)",
)
GROUP_NOTE = flag(
    "MLDIST_GROUP_NOTE",
    True,
    on="each worker notes at exit whether it joined a group",
    off="no note, no never-formed line",
    doc="`0`: the hook leaves no note on whether each worker joined a group (no never-formed line); the variables stay",
)
TF_CONFIG = flag(
    "MLDIST_TF_CONFIG",
    False,
    on="each worker gets TF_CONFIG",
    off="no TF_CONFIG",
    doc="`1` (`--tf-config`): each worker gets `TF_CONFIG`",
    by=(USER, LAUNCHER, BATCH),
)
GLOO_IDLE = flag(
    "MLDIST_GLOO_IDLE",
    True,
    on="Gloo's loop thread runs at idle priority",
    off="left at normal priority",
    doc="`0`: leave JAX's Gloo event-loop thread at normal priority (mldist moves it to `SCHED_IDLE`)",
)
VERBOSE = flag(
    "MLDIST_VERBOSE",
    False,
    on="start-up notices shown",
    off="hidden",
    doc="`1` (`--verbose`): the remote shim of `mldist run -H` passes TensorFlow's start-up notices on",
    by=(LAUNCHER,),
)
NO_RUN_DIR = flag(
    "MLDIST_NO_RUN_DIR",
    False,
    on="the run has no run directory",
    off="RunLog() makes runs/<script>-<time> on rank 0 when MLDIST_RUN_DIR is unset",
    doc="`1` (`--no-run-dir`): the run has no run directory: `RunLog()` writes nothing (`RunLog(DIR)` still does)",
    by=(LAUNCHER,),
)
COLLECTIVE_TIMEOUT: Setting[float] = Setting(
    "MLDIST_COLLECTIVE_TIMEOUT",
    600.0,
    seconds,
    "is not a number of seconds: set it to e.g. 600 (the default), or 0 to turn the stalled-collective watch off",
    "seconds a collective may take before the rank ends with one line (default 600, `0` off)",
    kind="seconds",
)
STRAGGLER_PERCENT: Setting[float] = Setting(
    "MLDIST_STRAGGLER_PERCENT",
    10.0,
    percent,
    "is not a percentage below 100: set it to e.g. 10 (the default), or 0 to turn the slow-rank line off",
    "a rank (or node) that costs the others this % of their time names itself on rank 0 (default 10, `0` off)",
    kind="percent",
)
#: The shortest ``MLDIST_STRAGGLER_SECONDS`` the slow-rank watch can fill: it takes a round a second
#: (:data:`mldist.runtime.watch.straggler_gather.ROUND_SECONDS`) and needs two in each third of the window.
STRAGGLER_SHORTEST = 6.0


def straggler_window(text: str) -> float | None:
    """``text`` as seconds above 0 (None when not); a ConfigError when shorter than the watch can fill.

    Example:
        >>> straggler_window("30"), straggler_window("0")
        (30.0, None)
    """
    value = positive_seconds(text)
    if value is not None and value < STRAGGLER_SHORTEST:
        raise ConfigError(
            f"MLDIST_STRAGGLER_SECONDS={text!r} is shorter than the slow-rank watch can fill (it takes a round a "
            f"second and needs two in each third of the window): set it to {STRAGGLER_SHORTEST:g} or more (default 30)"
        )
    return value


STRAGGLER_SECONDS: Setting[float] = Setting(
    "MLDIST_STRAGGLER_SECONDS",
    30.0,
    straggler_window,
    "is not a number of seconds above 0: set it to e.g. 30 (the default)",
    "for how long a rank must cost that share (in each third of it) before rank 0 names it (default 30, at least "
    "6); a shorter run is looked at whole, at its end",
    kind="seconds",
)
#: Ports are handed out from [base, base + PORT_SPAN), below Linux's ephemeral range (32768).
PORT_SPAN = 12000
DEFAULT_PORT_BASE = 20000
PORT_BASE: Setting[int] = Setting(
    "MLDIST_PORT_BASE",
    DEFAULT_PORT_BASE,
    whole(1024, 65535 - PORT_SPAN),
    f"is not a port from 1024 to {65535 - PORT_SPAN}: set it to one (default {DEFAULT_PORT_BASE}), or unset it",
    f"first port of the {PORT_SPAN}-port range mldist uses (default {DEFAULT_PORT_BASE})",
    kind="port",
)
CPUS_PER_TASK: Setting[int | None] = Setting(
    "MLDIST_CPUS_PER_TASK",
    None,
    whole(1),
    "is not a CPU count: set it to a whole number of 1 or more (e.g. 4), or unset it to use this rank's CPUs",
    "CPUs this rank owns, when no affinity mask or `SLURM_CPUS_PER_TASK` says so",
    (USER, BATCH),
    "whole number",
)


def _thread_count(name: str, pool: str) -> Setting[int | None]:
    says = (
        f"is not a thread count: give a whole number of 1 or more (e.g. {name}=4), "
        "or leave it unset for the plan from this rank's CPUs"
    )
    doc = f"TensorFlow's {pool} thread pool, over the plan (`init({pool}=)` wins over it)"
    return Setting(name, None, whole(1), says, doc, kind="whole number")


def _auto_on_off(text: str) -> str | None:
    """``auto``, or a yes (``on``) or a no (``off``); None for anything else."""
    if text.lower() == "auto":
        return "auto"
    said = yes_no(text)
    return None if said is None else "on" if said else "off"


HIERARCHICAL: Setting[str] = Setting(
    "MLDIST_HIERARCHICAL",
    "auto",
    _auto_on_off,
    "is not auto, 1 or 0: set auto (the default), 1 (on where it applies) or 0 (off), or unset it",
    "the MPI engine's all-reduce: `1` reduces on the node, all-reduces among one rank per node, broadcasts "
    "(several nodes, >1 rank on one); `auto`, `0` flat",
    kind="auto, 1 or 0",
)


INTRA_OP = _thread_count("MLDIST_INTRA_OP", "intra_op")
INTER_OP = _thread_count("MLDIST_INTER_OP", "inter_op")

# What you set, taken as it is.
COMMUNICATION = given(
    "MLDIST_COMMUNICATION",
    "`auto` (NCCL on GPUs, MPI on CPUs when mpi4py's world matches the launcher, else RING), `mpi`, `ring` or `nccl`",
    _RUN,
    "auto, mpi, ring or nccl",
)
WORKERS: Setting[tuple[str, ...] | None] = Setting(
    "MLDIST_WORKERS",
    None,
    items,
    "",
    "`host:port,...` of every rank, overriding discovery",
    _RUN,
    "host:port list",
)
HOST = given("MLDIST_HOST", "the name peers use to reach this rank (e.g. a high-speed interface's host name)", (USER,))
PROFILE_STEPS = given(
    "MLDIST_PROFILE_STEPS", "`A:B` (`--profile-steps`): a timeline of those steps on every rank", _RUN, "A:B"
)
PROGRESS_DIR = given(
    "MLDIST_PROGRESS_DIR",
    "where ranks publish their progress for stall lines and `mldist stacks` (default: the run directory's "
    "`progress/`, else this node's temporary directory)",
    (USER,),
    "path",
)
RUN_DIR = given(
    "MLDIST_RUN_DIR", "the run directory (config.json, rank-R.log, summary.json)", (USER, LAUNCHER, BATCH), "path"
)
RUNS_DIR = given(
    "MLDIST_RUNS_DIR", "where run directories go when no `--run-dir` names one (default `runs`)", (USER,), "path"
)
TRACE_DIR = given(
    "MLDIST_TRACE_DIR", "where timelines go (default: the run directory's `trace/`, else `./trace`)", (USER,), "path"
)
ELASTIC_DIR = given(
    "MLDIST_ELASTIC_DIR", "where `elastic.run` keeps its state (default: the run directory)", (USER,), "path"
)
COMMITS_DIR = given(
    "MLDIST_COMMITS_DIR", "a folder for the workers' in-memory commits other than /dev/shm", (USER,), "path"
)
DATA_DIR = given("MLDIST_DATA_DIR", "the data cache (after `--cache`; default `~/.cache/mldist/data`)", (USER,), "path")
STATE_DIR = given(
    "MLDIST_STATE_DIR", "where `mldist submit` indexes its jobs (default `$XDG_STATE_HOME/mldist`)", (USER,), "path"
)
MPIEXEC = given(
    "MLDIST_MPIEXEC",
    "the mpiexec `mldist run` starts (default: the one beside Python, else on PATH)",
    (USER,),
    "program",
)

# What mldist run sets for each worker (and what its shims read back).
RANK = count("MLDIST_RANK", "this worker's rank")
SIZE = count("MLDIST_SIZE", "how many workers the run has (Cobalt's aprun gets it with `-e`)", (LAUNCHER, BATCH), 1)
LOCAL_RANK = count("MLDIST_LOCAL_RANK", "this worker's rank among those on its host")
LOCAL_SIZE = count("MLDIST_LOCAL_SIZE", "how many workers run on this worker's host", (LAUNCHER, BATCH), 1)
NODE_RANK = count("MLDIST_NODE_RANK", "the number of this worker's host among the run's hosts")
RESTART: Setting[int] = Setting(
    "MLDIST_RESTART",
    0,
    whole(0),
    "is not a whole number of 0 or more",
    "how many times the group was restarted (0: the first start)",
    (LAUNCHER,),
    "whole number",
)
#: The largest pid Linux hands out (``PID_MAX_LIMIT``).
PID_MAX = 4194304
LAUNCHER_PID: Setting[int | None] = Setting(
    "MLDIST_LAUNCHER_PID",
    None,
    whole(1, PID_MAX),
    f"is not a process id (1 to {PID_MAX}): mldist run sets it to its own; unset it",
    "the launcher's pid: a worker whose launcher died stops",
    (LAUNCHER,),
    "pid",
)
RUN_ID = given("MLDIST_RUN_ID", "identifies this run (ports, records)")
ENGINE = given("MLDIST_ENGINE", "the engine `mldist run` decided for its workers")
DECISION = given(
    "MLDIST_DECISION",
    "the whole decision of `mldist run`, or of the job script of `mldist submit` (engine, backend, reasons, "
    "the facts it rests on): its workers take it",
    kind="JSON",
)
NOTES = given("MLDIST_NOTES", "the launcher's folder where a worker leaves its last line", kind="path")
COORDINATOR = given(
    "MLDIST_COORDINATOR",
    "rank 0's `host:port` where the launcher knows no other rank's (`mldist run -H`)",
    kind="host:port",
)
CPU_BIND = given("MLDIST_CPU_BIND", "`none` (the workers share the launcher's CPU mask) or `cores` (each has its own)")
CPU_SETS = given("MLDIST_CPU_SETS", "each rank's CPUs under mpiexec with `--cpu-bind cores`, as `0,1;2,3`")
LOG_DIR = given("MLDIST_LOG_DIR", "the folder of each rank's `rank-R.log` (`--log-dir`) under mpiexec", kind="path")
ELASTIC_ID = given("MLDIST_ELASTIC_ID", "the elastic run's id (`--min-np`, `--host-discovery-script`)")
HOOK_SKIP = given(
    "MLDIST_HOOK_SKIP", "set for mldist's own per-rank shims: the start-up hook is for the worker they start"
)
WORKER_GROUP = given(
    "MLDIST_WORKER_GROUP",
    "set (1) where mpiexec's per-rank shim starts the worker in a process group of its own: the worker "
    "stops that group whole if the launcher dies",
    (WORKER,),
)
HOOK_PID = given("MLDIST_HOOK_PID", "the worker's own pid, for the Python processes it starts in turn", (WORKER,))

# What the job script of mldist submit sets for its ranks.
JOB_DIR = given("MLDIST_JOB_DIR", "the job's folder: rank logs, `run/`, the environment record", (BATCH,), "path")
JOB_ID = given("MLDIST_JOB_ID", "the scheduler's id of the job", (BATCH,))
ATTEMPT = count("MLDIST_ATTEMPT", "how many times the job was requeued (0: the first attempt)", (BATCH,))
REQUEUE_MARK = given("MLDIST_REQUEUE_MARK", "a rank that wants the job requeued leaves `MARK.rank-R`", (BATCH,), "path")
ARRAY_INDEX = count("MLDIST_ARRAY_INDEX", "an array task's index (`{array_index}`)", (BATCH,))
CORES_PER_TASK = count("MLDIST_CORES_PER_TASK", "physical cores per rank, measured in the job", (BATCH,), 1)

#: What the workers (and their start-up hook) read: checked before ``mldist run`` starts one, and by
#: ``mldist.init()`` before any side effect.
WORKER_SETTINGS: tuple[Setting[Any], ...] = (
    COLLECTIVE_TIMEOUT,
    STRAGGLER_PERCENT,
    STRAGGLER_SECONDS,
    PORT_BASE,
    CPUS_PER_TASK,
    INTRA_OP,
    INTER_OP,
    REQUIRE_GROUP,
    PLOT,
    HOOK,
    GROUP_NOTE,
    TF_CONFIG,
    GLOO_IDLE,
    VERBOSE,
    NO_RUN_DIR,
    HIERARCHICAL,
)
#: The whole contract, every variable once, in the order above.
ALL: tuple[Setting[Any], ...] = tuple(v for v in globals().values() if isinstance(v, Setting))
_PLACEHOLDER = re.compile(r"@([A-Z][A-Z0-9_]*)@")


def problems(env: Mapping[str, str]) -> list[str]:
    """The error line of each variable of :data:`WORKER_SETTINGS` whose value in ``env`` is refused.

    Example:
        >>> problems({"MLDIST_REQUIRE_GROUP": "maybe"})[0][:47]
        "MLDIST_REQUIRE_GROUP='maybe' is not yes or no: "
        >>> problems({"MLDIST_REQUIRE_GROUP": "yes", "MLDIST_COLLECTIVE_TIMEOUT": "0"})
        []
    """
    found = []
    for setting in WORKER_SETTINGS:
        try:
            setting.read(env)
        except ConfigError as exc:
            found.append(str(exc))
    return found


def check(env: Mapping[str, str]) -> None:
    """Raise the first of :func:`problems` (one line), if any: the decision ``mldist run`` and ``init`` share.

    Example:
        >>> check({"MLDIST_PLOT": "0", "MLDIST_HOOK": "No"})
    """
    found = problems(env)
    if found:
        raise ConfigError(found[0])


def shell(template: str) -> str:
    """Generated shell with each ``@NAME@`` spelled as the table's variable ``MLDIST_NAME``.

    The job scripts take the names from the table this way; a NAME that is not in it is a KeyError
    as soon as the module that writes the shell is imported.

    Example:
        >>> shell('mkdir -p "$@JOB_DIR@" && echo "${@ATTEMPT@:-0}" "$@"')
        'mkdir -p "$MLDIST_JOB_DIR" && echo "${MLDIST_ATTEMPT:-0}" "$@"'
    """
    names = {setting.name[len(PREFIX) :]: setting.name for setting in ALL}
    return _PLACEHOLDER.sub(lambda found: names[found.group(1)], template)
