"""Decisions about CPUs and GPUs for one worker: its share of the node.

``init`` applies them; ``mldist env`` prints them. Nothing here changes the
process: inputs are numbers and environment mappings, outputs are plans.
:func:`cpu_probe` is the one place that asks the OS which CPUs we may use.

Example:
    >>> plan_threads(affinity=4, total=8, cpus_per_task=None, local_size=2)
    ThreadPlan(cpus=4, intra_op=4, inter_op=2, source='affinity mask', overrides='', note='')
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..base import envvalues
from ..errors import ConfigError


@dataclass(frozen=True)
class ThreadPlan:
    """CPU threads for one worker.

    Args:
        cpus: CPUs this rank owns.
        intra_op, inter_op: TensorFlow thread pool sizes.
        source: where ``cpus`` came from (for ``mldist env``).
        overrides: which pool sizes the user set and where (``init`` argument or variable), else "".
        note: one line for the user when an inherited variable lowered the plan, else "".
    """

    cpus: int
    intra_op: int
    inter_op: int
    source: str
    overrides: str = ""
    note: str = ""


def plan_threads(
    affinity: int,
    total: int,
    cpus_per_task: int | None,
    local_size: int,
    given_by: str = "cpus per task",
    shared: bool = False,
    size: int = 1,
) -> ThreadPlan:
    """Threads from the CPUs this rank owns.

    The affinity mask wins when a launcher narrowed it for this rank (srun, aprun -cc,
    mpiexec --cpu-bind); then ``--cpus-per-task``; else the CPUs of the mask shared
    evenly among the ranks on the node: the whole node, or the job's CPU set when
    the ranks were started inside one unbound (``mldist run`` in a cpuset, a
    container or ``salloc -c 8``: each rank of 4 gets 2, not all 8). Site guides use
    intra-op = cores and inter-op = 1 or 2: 2 from 4 CPUs, and in every rank of a group that spans
    nodes. A collective starts with an op of TensorFlow's graph (the MPI engine's start op, RING's and
    NCCL's kernels); with one inter-op thread TensorFlow runs backprop's chain of ops inline to its end
    before any op it queued, so every bucket's all-reduce began after the whole backward pass. Two hosts
    over a 1 Gbit/s link, MobileNetV2, 1 CPU per rank: 123 -> 155-164 images/s per worker with two. On
    one node the all-reduce is cheap and the second thread's ops share the rank's core: 176-187 -> 163-167
    (loopback, same model), so there it stays one.

    Args:
        affinity: CPUs in this process's affinity mask.
        total: CPUs of the node.
        cpus_per_task: ``SLURM_CPUS_PER_TASK`` or similar, if set.
        local_size: ranks on this node.
        given_by: where ``cpus_per_task`` came from (the plan's ``source``).
        shared: the launcher left every rank on the node the same mask (it did not bind them).
        size: ranks in the whole group (more than ``local_size``: it spans nodes).

    Example:
        >>> plan_threads(8, 8, None, 4).cpus
        2
        >>> plan_threads(8, 64, None, 4, shared=True).cpus
        2
        >>> plan_threads(8, 8, 1, 4, "OMP_NUM_THREADS").source
        'OMP_NUM_THREADS'
    """
    if affinity < total and not shared:
        cpus, source = affinity, "affinity mask"
    elif cpus_per_task:
        cpus, source = cpus_per_task, given_by
    else:
        cpus, source = max(1, affinity // max(1, local_size)), f"{affinity} cores / {local_size} ranks"
    return ThreadPlan(cpus, cpus, 2 if cpus >= 4 or size > local_size else 1, source)


@dataclass(frozen=True)
class CpuProbe:
    """The CPUs of this node and those this process may run on.

    Args:
        total: CPUs of the node.
        allowed: CPU ids in this process's affinity mask.
        shared: the launcher started every rank on this node with the same mask (``mldist run``
            without ``--cpu-bind cores``), so a mask narrower than the node is the job's, not this rank's.
    """

    total: int
    allowed: tuple[int, ...]
    shared: bool = False

    @property
    def pinned(self) -> bool:
        """Whether a launcher narrowed the affinity mask below the whole node for this rank alone."""
        return len(self.allowed) < self.total and not self.shared


#: Set by ``mldist run`` for its workers: ``none`` (they share its mask) or ``cores`` (each has its own).
CPU_BIND_ENV = envvalues.CPU_BIND.name


def cpu_probe(env: Mapping[str, str] | None = None) -> CpuProbe:
    """Ask the OS for this node's CPUs and this process's affinity mask.

    Args:
        env: the rank's environment, for whether the launcher shared its mask (:data:`CPU_BIND_ENV`).

    Example:
        >>> p = cpu_probe()
        >>> 1 <= len(p.allowed) <= p.total
        True
    """
    total = os.cpu_count() or 1
    shared = envvalues.CPU_BIND.read(env or {}) == "none"
    if hasattr(os, "sched_getaffinity"):
        return CpuProbe(total, tuple(sorted(os.sched_getaffinity(0))), shared)
    return CpuProbe(total, tuple(range(total)), shared)


#: Where a rank's CPU count may be given, first one set wins, and how ``mldist env`` labels it.
#: OMP_NUM_THREADS is often inherited from a login shell or module rather than chosen for the job.
CPUS_PER_TASK_SOURCES = {
    envvalues.CPUS_PER_TASK.name: "cpus per task",
    "SLURM_CPUS_PER_TASK": "cpus per task",
    "ALPS_APP_DEPTH": "aprun -d",
    "OMP_NUM_THREADS": "OMP_NUM_THREADS",
}
CPUS_PER_TASK_VARS = tuple(CPUS_PER_TASK_SOURCES)


def cpus_per_task_from(env: Mapping[str, str]) -> tuple[int, str] | None:
    """The first positive integer among :data:`CPUS_PER_TASK_VARS` and its variable; others are ignored.

    Ours, ``MLDIST_CPUS_PER_TASK``, is refused when it is not a count (ConfigError): someone chose it
    for mldist. The others may be inherited, or meant for another program, so they are skipped.

    Example:
        >>> cpus_per_task_from({"SLURM_CPUS_PER_TASK": "x", "OMP_NUM_THREADS": "4"})
        (4, 'OMP_NUM_THREADS')
    """
    ours = envvalues.CPUS_PER_TASK.read(env)
    if ours is not None:
        return ours, envvalues.CPUS_PER_TASK.name
    for name in CPUS_PER_TASK_VARS:
        raw = env.get(name, "")
        if raw.isascii() and raw.isdigit() and int(raw) > 0:
            return int(raw), name
    return None


def cpus_per_task(env: Mapping[str, str]) -> int | None:
    """The CPU count of :func:`cpus_per_task_from`, or None.

    Example:
        >>> cpus_per_task({"SLURM_CPUS_PER_TASK": "x", "OMP_NUM_THREADS": "4"})
        4
    """
    found = cpus_per_task_from(env)
    return found[0] if found else None


#: Thread pools a user may size, and the variable that does it (an ``init`` argument wins over it).
THREAD_KNOBS = (("intra_op", envvalues.INTRA_OP), ("inter_op", envvalues.INTER_OP))


def thread_count(value: object, name: str) -> int:
    """``value`` as a thread count (a positive integer, or its decimal text); else ConfigError naming ``name``.

    Example:
        >>> thread_count("4", "MLDIST_INTRA_OP"), thread_count(2, "inter_op")
        (4, 2)
    """
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str) and text.isascii() and text.isdigit():
        text = int(text)
    if isinstance(text, int) and not isinstance(text, bool) and text > 0:
        return text
    raise ConfigError(
        f"{name}={value!r} is not a thread count: give a whole number of 1 or more "
        f"(e.g. {name}=4), or leave it unset for the plan from this rank's CPUs"
    )


def override_threads(plan: ThreadPlan, env: Mapping[str, str], **given: int | None) -> ThreadPlan:
    """``plan`` with the pool sizes the user set: an ``init`` argument, else the variable, else the plan.

    Args:
        plan: the plan from this rank's CPUs.
        env: the rank's environment (``MLDIST_INTRA_OP``, ``MLDIST_INTER_OP``).
        given: ``intra_op``/``inter_op`` passed to ``init`` (None: not given).

    Example:
        >>> p = override_threads(ThreadPlan(4, 4, 2, "x"), {"MLDIST_INTER_OP": "1"}, intra_op=8)
        >>> p.intra_op, p.inter_op, p.overrides
        (8, 1, 'intra-op from init(intra_op=8), inter-op from MLDIST_INTER_OP=1')
    """
    changes: dict[str, int] = {}
    notes = []
    for knob, var in THREAD_KNOBS:
        if given.get(knob) is not None:
            changes[knob] = thread_count(given[knob], knob)
            notes.append(f"{knob.replace('_', '-')} from init({knob}={changes[knob]})")
        elif (count := var.read(env)) is not None:
            changes[knob] = count
            notes.append(f"{knob.replace('_', '-')} from {var.name}={count}")
    if not changes:
        return plan
    intra, inter = changes.get("intra_op", plan.intra_op), changes.get("inter_op", plan.inter_op)
    return replace(plan, intra_op=intra, inter_op=inter, overrides=", ".join(notes))


def thread_plan(
    env: Mapping[str, str],
    local_size: int,
    probe: CpuProbe | None = None,
    *,
    intra_op: int | None = None,
    inter_op: int | None = None,
    size: int = 1,
) -> ThreadPlan:
    """This rank's thread plan from its environment and CPUs: what ``init`` applies and ``mldist env`` shows.

    Pool sizes given as arguments win over ``MLDIST_INTRA_OP``/``MLDIST_INTER_OP``, which win
    over the plan from the CPUs (:func:`plan_threads`). An ``OMP_NUM_THREADS`` below the rank's
    share of the node (often inherited, e.g. ``1`` from a login shell) is followed but noted.

    Args:
        env: the rank's environment.
        local_size: ranks on this node.
        probe: the CPUs (default: :func:`cpu_probe` of ``env``).
        intra_op, inter_op: sizes passed to ``mldist.init`` (None: not given).
        size: ranks in the whole group (more than on this node: two inter-op threads, see :func:`plan_threads`).

    Example:
        >>> thread_plan({}, 2, CpuProbe(8, tuple(range(8)))).cpus
        4
        >>> thread_plan({"MLDIST_INTRA_OP": "3"}, 2, CpuProbe(8, tuple(range(8)))).intra_op
        3
        >>> thread_plan({"OMP_NUM_THREADS": "1"}, 2, CpuProbe(8, tuple(range(8)))).note[:40]
        'OMP_NUM_THREADS=1 gives each rank 1 CPU '
    """
    p = probe or cpu_probe(env)
    count, name = cpus_per_task_from(env) or (None, "")
    given_by = CPUS_PER_TASK_SOURCES.get(name, "")
    plan = plan_threads(len(p.allowed), p.total, count, local_size, given_by, shared=p.shared, size=size)
    own = plan_threads(len(p.allowed), p.total, None, local_size, shared=p.shared, size=size)  # without the variable
    share = own.cpus
    if plan.source == "OMP_NUM_THREADS" and plan.cpus == share:
        plan = own  # the share itself (mldist run sets it so, before the worker imports numpy): named as such
    if plan.source == "OMP_NUM_THREADS" and plan.cpus < share:
        note = (
            f"OMP_NUM_THREADS={plan.cpus} gives each rank {plan.cpus} CPU thread(s) of the {share} it could use; "
            f"unset OMP_NUM_THREADS (or set {envvalues.CPUS_PER_TASK.name}={share}) if it was inherited, not chosen"
        )
        plan = replace(plan, note=note)
    return override_threads(plan, env, intra_op=intra_op, inter_op=inter_op)


def openmp_defaults(plan: ThreadPlan, pinned: bool) -> dict[str, str]:
    """OpenMP variables for Intel's runtime, as the site guides set them.

    ``KMP_AFFINITY`` pins threads compactly; that is only right when this
    process has its own CPU set, otherwise every rank on a node would pin
    to the same cores.

    Args:
        plan: this rank's thread plan.
        pinned: whether the affinity mask is narrower than the node.

    Example:
        >>> openmp_defaults(ThreadPlan(2, 2, 1, "x"), pinned=False)
        {'OMP_NUM_THREADS': '2', 'KMP_BLOCKTIME': '0'}
    """
    out = {"OMP_NUM_THREADS": str(plan.cpus), "KMP_BLOCKTIME": "0"}
    if pinned:
        out["KMP_AFFINITY"] = "granularity=fine,compact,1,0"
    return out


def choose_gpu(visible: int, local_rank: int, local_size: int) -> int | None:
    """Index, among the GPUs this process sees, of the one this rank uses.

    A launcher that already narrowed ``CUDA_VISIBLE_DEVICES`` to one GPU per
    task leaves one visible GPU: use it. Otherwise rank ``i`` on the node
    takes visible GPU ``i``, so a site's reversed order (``3,2,1,0``) is kept.

    Args:
        visible: GPUs this process can see.
        local_rank, local_size: position on the node.

    Example:
        >>> choose_gpu(4, 2, 4), choose_gpu(1, 3, 4), choose_gpu(0, 0, 1)
        (2, 0, None)
    """
    if visible == 0:
        return None
    if visible == 1:
        return 0
    if local_rank >= visible:
        raise ConfigError(
            f"local rank {local_rank} has no GPU: {visible} are visible for {local_size} ranks "
            f"on this node; start at most {visible} ranks per node (e.g. --tasks-per-node={visible})"
        )
    return local_rank


def idle_gpus_warning(gpus: int, local_size: int, in_scope: bool) -> str | None:
    """The warning for one process per node seeing several GPUs but averaging outside a strategy scope.

    ``DistributedOptimizer`` and ``DistributedGradientTape`` outside a scope run the model
    on one GPU; the others sit idle. None when that is not the case.

    Args:
        gpus: GPUs this process sees.
        local_size: processes on this node.
        in_scope: whether a tf.distribute strategy scope is active.

    Example:
        >>> idle_gpus_warning(4, 1, False)[:40]
        'this process sees 4 GPUs but trains on o'
        >>> idle_gpus_warning(4, 4, False), idle_gpus_warning(4, 1, True), idle_gpus_warning(1, 1, False)
        (None, None, None)
    """
    if gpus < 2 or local_size != 1 or in_scope:
        return None
    return (
        f"this process sees {gpus} GPUs but trains on one of them: mldist's DistributedOptimizer and "
        f"DistributedGradientTape outside a strategy scope use one GPU per process. Start one process "
        f"per GPU (mldist submit/srun --tasks-per-node={gpus}, the GPUs per node), or build and train "
        "the model under `with mldist.strategy().scope():`"
    )


def physical_gpu_id(index: int, cuda_visible_devices: str | None) -> str:
    """The device id behind visible GPU ``index`` (for reports).

    Example:
        >>> physical_gpu_id(1, "3,2,1,0")
        '2'
    """
    if cuda_visible_devices:
        ids = [x.strip() for x in cuda_visible_devices.split(",") if x.strip()]
        if index < len(ids):
            return ids[index]
    return str(index)
