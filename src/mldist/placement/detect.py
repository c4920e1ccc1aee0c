"""Who am I? Environment detection as a pure function of an environment mapping.

Each launcher is one row of ``LAUNCHERS``: the variable whose presence marks
it and, per field, the variables to read (first one present wins). Rows are
tried in order, so MPI launchers come before Slurm: under ``mpirun`` inside a
Slurm job ``SLURM_PROCID`` is 0 on every rank and must not win.

Example:
    >>> p = detect({"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
    ...             "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
    ...             "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"})
    >>> (p.launcher, p.rank, p.size, p.hosts)
    ('slurm', 1, 2, ('n1', 'n2'))
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..base import envvalues
from ..errors import DetectionError
from .allocation import read_nodefile
from .hostlist import expand_hostlist, expand_tasks_per_node

Env = Mapping[str, str]


@dataclass(frozen=True)
class Placement:
    """Where this process sits in the job, as the launcher describes it.

    Args:
        launcher: row name in ``LAUNCHERS`` ("none" for a plain process).
        rank, size, local_rank, local_size: global and per-node positions.
        node_index: index of this process's node in ``hosts``, if known.
        hosts: one name per node, in node order, when the launcher gives them.
        rank_nodes: node index of every rank, when it follows from the launcher.
        workers: ``host:port`` of every rank, when the launcher gives them.
        job_key: job/step identity used to keep ports of concurrent jobs apart.
    """

    launcher: str
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    node_index: int | None = None
    hosts: tuple[str, ...] | None = None
    rank_nodes: tuple[int, ...] | None = None
    workers: tuple[str, ...] | None = None
    job_key: str = ""


@dataclass(frozen=True)
class LauncherRule:
    """One launcher: the marker variable and where each field is read from.

    ``extra`` derives what plain variables cannot give (host lists,
    per-rank nodes) and returns fields to override. ``size_fix`` says how to give
    the world size when the launcher's own variables do not (default: set them).
    ``defer`` leaves a process whose marker is set to a later rule (one that knows more).
    """

    name: str
    marker: str
    fields: Mapping[str, tuple[str, ...]]
    extra: Callable[[Env, dict[str, int]], dict[str, object]] | None = None
    doc: str = ""
    job_vars: tuple[str, ...] = field(default=())
    size_fix: str = ""
    defer: Callable[[Env], bool] | None = None


def _int(env: Env, names: tuple[str, ...], launcher: str, what: str) -> int | None:
    for name in names:
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        try:
            return int(raw)
        except ValueError:
            raise DetectionError(
                f"{name}={raw!r} is not an integer ({launcher} {what}); check the launcher's environment"
            ) from None
    return None


def _read_nodefile(path: str) -> tuple[str, ...]:
    """Unique host names of a PBS node file, in first-seen order (:func:`mldist.placement.allocation.read_nodefile`)."""
    try:
        return tuple(host for host, _ in read_nodefile(path))
    except OSError as exc:
        raise DetectionError(f"PBS_NODEFILE={path!r} cannot be read ({exc.strerror})") from None


def slurm_rank_nodes(tasks_per_node: list[int], distribution: str) -> tuple[int, ...]:
    """Node index of every task for Slurm's block or cyclic distribution.

    Args:
        tasks_per_node: expanded ``SLURM_STEP_TASKS_PER_NODE``.
        distribution: ``SLURM_DISTRIBUTION`` (``block``, ``cyclic``, ...).

    Example:
        >>> slurm_rank_nodes([2, 1], "cyclic")
        (0, 1, 0)
    """
    if distribution.split(":")[0] != "cyclic":
        return tuple(n for n, count in enumerate(tasks_per_node) for _ in range(count))
    left, out = list(tasks_per_node), []
    while any(left):
        for n, count in enumerate(left):
            if count:
                out.append(n)
                left[n] -= 1
    return tuple(out)


def _slurm_extra(env: Env, got: dict[str, int]) -> dict[str, object]:
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    tpn_text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    out: dict[str, object] = {}
    if nodelist:
        out["hosts"] = tuple(expand_hostlist(nodelist))
    if tpn_text:
        tpn = expand_tasks_per_node(tpn_text)
        node = got.get("node_index")
        if node is not None and node < len(tpn):
            out["local_size"] = tpn[node]
        nodes = slurm_rank_nodes(tpn, env.get("SLURM_DISTRIBUTION", "block"))
        # Only trust the computed layout if it agrees with what Slurm told us.
        if len(nodes) == got.get("size") and nodes[got.get("rank", 0)] == node:
            out["rank_nodes"] = nodes
    return out


def _mldist_extra(env: Env, got: dict[str, int]) -> dict[str, object]:
    workers = envvalues.WORKERS.read(env)
    return {"workers": workers} if workers else {}


def _pals_extra(env: Env, got: dict[str, int]) -> dict[str, object]:
    path = env.get("PBS_NODEFILE")
    return {"hosts": _read_nodefile(path)} if path else {}


def _pbs_extra(env: Env, got: dict[str, int]) -> dict[str, object]:
    # A batch script is one process on the job's first node (the node file's first host).
    path = env.get("PBS_NODEFILE")
    return {"hosts": _read_nodefile(path)[:1], "node_index": 0} if path else {}


def _aprun_extra(env: Env, got: dict[str, int]) -> dict[str, object]:
    # aprun places PEs block-wise (-N per node) and exports neither local rank nor node.
    per_node = got.get("local_size")
    if per_node is None or "local_rank" in got:
        return {}
    return {"local_rank": got["rank"] % per_node, "node_index": got["rank"] // per_node}


# Open MPI 5 names its job only in PMIX_NAMESPACE; MLDIST_RUN_ID when `mldist run` started mpiexec.
_MPI_JOB = (
    "SLURM_JOB_ID",
    "PBS_JOBID",
    "COBALT_JOBID",
    "OMPI_MCA_ess_base_jobid",
    "PMIX_NAMESPACE",
    "PMI_ID",
    envvalues.RUN_ID.name,
)


def srun_direct(env: Env) -> bool:
    """Whether srun itself started this rank through its PMI plugin (``srun --mpi=pmi2``), not Hydra.

    Slurm's PMI plugins export ``PMI_RANK`` too; Slurm's placement knows the hosts. Hydra inside an
    allocation starts its proxies with srun, one per node: there the PMI rank is not srun's.

    Example:
        >>> srun_direct({"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "PMI_RANK": "1", "SLURM_STEP_NUM_TASKS": "2",
        ...              "PMI_SIZE": "2"})
        True
    """
    size = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS")
    return "SLURM_STEP_ID" in env and (env.get("PMI_RANK"), env.get("PMI_SIZE")) == (env.get("SLURM_PROCID"), size)


#: Launchers in priority order. Field names map to candidate variables.
LAUNCHERS: tuple[LauncherRule, ...] = (
    LauncherRule(
        "mldist",
        envvalues.RANK.name,
        {
            "rank": (envvalues.RANK.name,),
            "size": (envvalues.SIZE.name,),
            "local_rank": (envvalues.LOCAL_RANK.name,),
            "local_size": (envvalues.LOCAL_SIZE.name,),
            "node_index": (envvalues.NODE_RANK.name,),
        },
        _mldist_extra,
        "mldist run",
        (envvalues.RUN_ID.name,),
    ),
    LauncherRule(
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        {
            "rank": ("OMPI_COMM_WORLD_RANK",),
            "size": ("OMPI_COMM_WORLD_SIZE",),
            "local_rank": ("OMPI_COMM_WORLD_LOCAL_RANK",),
            "local_size": ("OMPI_COMM_WORLD_LOCAL_SIZE",),
        },
        None,
        "Open MPI mpirun/mpiexec",
        _MPI_JOB,
    ),
    LauncherRule(
        "pals",
        "PALS_RANKID",
        {
            "rank": ("PALS_RANKID",),
            "size": ("PMI_SIZE", "PALS_NRANKS"),
            "local_rank": ("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"),
            "local_size": ("PMI_LOCAL_SIZE", "PALS_LOCAL_SIZE"),
            "node_index": ("PALS_NODEID",),
        },
        _pals_extra,
        "Cray PALS mpiexec",
        ("PBS_JOBID", "PALS_APID"),
    ),
    LauncherRule(
        "mpich",
        "PMI_RANK",
        {
            "rank": ("PMI_RANK",),
            "size": ("PMI_SIZE",),
            "local_rank": ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
            "local_size": ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"),
        },
        None,
        "MPICH/Hydra or Intel MPI mpiexec",
        _MPI_JOB,
        defer=srun_direct,
    ),
    LauncherRule(
        "aprun",
        "ALPS_APP_PE",
        {
            "rank": ("ALPS_APP_PE",),
            "size": (envvalues.SIZE.name, "PMI_SIZE"),
            "local_rank": ("PMI_LOCAL_RANK",),
            "local_size": (envvalues.LOCAL_SIZE.name, "PMI_LOCAL_SIZE"),
        },
        _aprun_extra,
        "Cray ALPS aprun",
        ("COBALT_JOBID", "ALPS_APP_ID"),
        # No ALPS variable carries the PE count; Cray PMI exports PMI_SIZE only on some systems.
        f"aprun exports no world size; set {envvalues.SIZE.name} to aprun's -n (and {envvalues.LOCAL_SIZE.name} "
        f"to its -N): aprun -n 8 -N 4 -e {envvalues.SIZE.name}=8 -e {envvalues.LOCAL_SIZE.name}=4 ... "
        "(mldist submit's scripts do)",
    ),
    LauncherRule(
        "slurm",
        "SLURM_STEP_ID",
        {
            "rank": ("SLURM_PROCID",),
            "size": ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
            "local_rank": ("SLURM_LOCALID",),
            "node_index": ("SLURM_NODEID",),
        },
        _slurm_extra,
        "Slurm srun",
        ("SLURM_JOB_ID", "SLURM_STEP_ID"),
    ),
    LauncherRule("pbs", "PBS_NODEFILE", {}, _pbs_extra, "PBS batch script", ("PBS_JOBID",)),
)


def _from_tf_config(raw: str) -> Placement:
    try:
        cfg = json.loads(raw)
        workers = tuple(cfg["cluster"]["worker"])
        task = cfg.get("task", {})
        rank = int(task.get("index", 0))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise DetectionError(
            f"TF_CONFIG={raw[:80]!r} is not of the form "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": N}}'
        ) from None
    if task.get("type", "worker") != "worker" or not 0 <= rank < len(workers):
        raise DetectionError(
            f"TF_CONFIG task {task!r} is not one of the {len(workers)} workers; mldist supports worker-only clusters"
        )
    hosts = tuple(dict.fromkeys(w.rsplit(":", 1)[0] for w in workers))
    nodes = tuple(hosts.index(w.rsplit(":", 1)[0]) for w in workers)
    me = nodes[rank]
    return Placement(
        "tf_config",
        rank=rank,
        size=len(workers),
        local_rank=nodes[:rank].count(me),
        local_size=nodes.count(me),
        node_index=me,
        hosts=hosts,
        rank_nodes=nodes,
        workers=workers,
    )


def _apply(rule: LauncherRule, env: Env) -> Placement:
    got = {k: v for k, names in rule.fields.items() if (v := _int(env, names, rule.name, k)) is not None}
    if rule.fields and "size" not in got:
        names = " or ".join(dict.fromkeys([*rule.fields["size"], envvalues.SIZE.name]))
        fix = rule.size_fix or f"set {names}"
        raise DetectionError(f"{rule.doc} detected ({rule.marker} is set) but the world size is unknown: {fix}")
    extra = rule.extra(env, got) if rule.extra else {}
    values: dict[str, object] = {**got, **extra}
    job_key = ".".join(env[v] for v in rule.job_vars if env.get(v))
    placement = Placement(rule.name, job_key=job_key, **values)  # type: ignore[arg-type]
    _validate(placement)
    return placement


def _validate(p: Placement) -> None:
    if p.size < 1 or not 0 <= p.rank < p.size:
        raise DetectionError(f"{p.launcher}: rank {p.rank} is outside a world of size {p.size}")
    if p.local_size < 1 or not 0 <= p.local_rank < p.local_size:
        raise DetectionError(f"{p.launcher}: local rank {p.local_rank} is outside a node of {p.local_size} processes")
    if p.workers is not None and len(p.workers) != p.size:
        raise DetectionError(f"{p.launcher}: {len(p.workers)} worker addresses given for a world of size {p.size}")


def detect(env: Env) -> Placement:
    """Detect the launcher and this process's place in the job.

    Args:
        env: an environment mapping, usually ``os.environ``.

    Example:
        >>> detect({}).launcher
        'none'
    """
    # Whether a launcher of ours named a rank at all (its value is the mldist rule's to read).
    if envvalues.RANK.name not in env and env.get("TF_CONFIG"):
        return _from_tf_config(env["TF_CONFIG"])
    for rule in LAUNCHERS:
        if env.get(rule.marker) is not None and not (rule.defer and rule.defer(env)):
            return _apply(rule, env)
    return Placement("none")
