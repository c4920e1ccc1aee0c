"""Whether ``mldist run`` is inside a batch allocation, and what that allocation holds (pure, but for
:func:`read_nodefile`: the one reader of PBS node files).

After ``salloc -N 2``, inside an ``sbatch`` script or a PBS job (``qsub -I`` too), ``mldist run``
places its workers over the allocation's nodes through the scheduler's own launcher (srun; Open
MPI's mpiexec with the node file under PBS), unless ``--local``. Inside an srun step it is
already one of the job's tasks: no allocation to spread over.

Example:
    >>> a = allocation({"SLURM_JOB_ID": "20", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NTASKS": "4"})
    >>> a.scheduler, a.nodes, a.tasks
    ('slurm', ('node1', 'node2'), 4)
    >>> allocation({"SLURM_JOB_ID": "20", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "node1"}) is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..base.envparse import whole
from .hostlist import expand_hostlist


@dataclass(frozen=True)
class Allocation:
    """A batch allocation seen from its batch script or interactive shell.

    Args:
        scheduler: "slurm" or "pbs".
        job_id: the scheduler's job id.
        nodes: the allocation's nodes in order (Slurm); () until the node file is read (PBS).
        tasks: the tasks it was given (Slurm's ``SLURM_NTASKS``; PBS: the node file's lines), or None:
            one per node.
        nodefile: PBS's node file (one line per MPI slot), or None.
    """

    scheduler: str
    job_id: str
    nodes: tuple[str, ...] = ()
    tasks: int | None = None
    nodefile: str | None = None

    @property
    def slots(self) -> int:
        """How many workers it holds: its tasks, else one per node."""
        return self.tasks if self.tasks is not None else len(self.nodes)


def allocation(env: Mapping[str, str]) -> Allocation | None:
    """The allocation this process runs in (outside any of its steps), or None.

    Args:
        env: the process environment.

    Example:
        >>> allocation({"PBS_JOBID": "7.pbs", "PBS_NODEFILE": "/var/spool/pbs/aux/7.pbs"}).nodefile
        '/var/spool/pbs/aux/7.pbs'
    """
    if env.get("SLURM_JOB_ID") and "SLURM_STEP_ID" not in env:
        listed = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        tasks = env.get("SLURM_NTASKS", "")
        nodes = tuple(expand_hostlist(listed)) if listed else ()
        return Allocation("slurm", env["SLURM_JOB_ID"], nodes, whole(1)(tasks))
    # Slurm exports PBS_JOBID too (its PBS compatibility), never PBS_NODEFILE: that is PBS's own.
    if env.get("PBS_JOBID") and env.get("PBS_NODEFILE"):
        return Allocation("pbs", env["PBS_JOBID"], nodefile=env["PBS_NODEFILE"])
    return None


def nodefile_hosts(text: str) -> tuple[tuple[str, int], ...]:
    """``(host, slots)`` of a PBS node file: one line per slot, hosts in order of first appearance.

    Example:
        >>> nodefile_hosts("x1.hsn\\nx1.hsn\\nx2.hsn\\n\\n")
        (('x1.hsn', 2), ('x2.hsn', 1))
    """
    counts: dict[str, int] = {}
    for line in filter(None, (raw.strip() for raw in text.splitlines())):
        counts[line] = counts.get(line, 0) + 1
    return tuple(counts.items())


def read_nodefile(path: str) -> tuple[tuple[str, int], ...]:
    """``(host, slots)`` of the PBS node file at ``path`` (:func:`nodefile_hosts`); OSError when it cannot be
    read. What ``mldist run`` spreads over and what the placement of a PBS rank reads.

    Example::

        read_nodefile(os.environ["PBS_NODEFILE"])   # (('x1.hsn', 4), ('x2.hsn', 4))
    """
    with open(path, encoding="utf-8") as fh:
        return nodefile_hosts(fh.read())
