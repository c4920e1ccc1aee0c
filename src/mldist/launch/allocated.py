"""``mldist run`` inside a batch allocation: the workers over its nodes, through the scheduler's launcher.

After ``salloc -N 2``, in an ``sbatch`` script or a PBS job, ``mldist run -n 4 python train.py``
starts one :mod:`mldist.launch.remote_shim` per rank as ``-H`` does, but with the scheduler's
own launcher: ``srun`` inside the Slurm allocation (``--mpi=pmix`` where Slurm offers it, so the
MPI engine forms one world), Open MPI's ``mpiexec --hostfile $PBS_NODEFILE`` under PBS (its tm
launcher where Open MPI has it, else ssh). Everything else is the ``-H`` group's: the run
directory with every rank's log, the first failure named, signals, ``--max-restarts``.
``mldist run --local`` keeps the workers on this node. :mod:`mldist.placement.allocation`
decides whether there is an allocation.

Example:
    >>> srun_argv(2, 4, ["--mpi=pmix"], ["python", "t.py"])[:5]
    ['srun', '--nodes=2', '--ntasks=4', '--kill-on-bad-exit=1', '--mpi=pmix']
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

from ..errors import LaunchError
from .procs import say
from .remote import RemoteGroup, remote_argv

#: srun's plugin that gives Open MPI's ranks one world (the batch scripts choose it the same way).
PMIX = "pmix"


def srun_argv(nodes: int, n: int, mpi: Sequence[str], command: Sequence[str]) -> list[str]:
    """srun starting ``n`` shims of ``command`` on ``nodes`` nodes of the allocation, ended by a failed rank."""
    shim = [sys.executable, "-m", "mldist.launch.remote_shim", "--", *command]
    return ["srun", f"--nodes={nodes}", f"--ntasks={n}", "--kill-on-bad-exit=1", *mpi, *shim]


def srun_mpi(listing: str) -> list[str]:
    """``--mpi=pmix`` when ``srun --mpi=list`` names PMIx, else nothing (the site's default plugin).

    Example:
        >>> srun_mpi("MPI plugin types are...\\n\\tnone\\n\\tpmi2\\n\\tpmix\\n"), srun_mpi("none\\npmi2")
        (['--mpi=pmix'], [])
    """
    return [f"--mpi={PMIX}"] if PMIX in listing.split() else []


class SrunGroup(RemoteGroup):
    """Workers over a Slurm allocation's nodes, started by srun."""

    def launcher(self) -> str:
        return "srun"

    def argv(self, launcher: str, names: list[str]) -> list[str]:
        """srun passes the whole environment on (``--export=ALL``): ``names`` are not needed."""
        cfg = self.cfg
        try:
            listing = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True, timeout=30, env=self.env)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LaunchError(f"inside a Slurm allocation, but srun does not run: {exc}; use --local") from None
        nodes = min(len(cfg.hosts), cfg.nprocs)
        return srun_argv(nodes, cfg.nprocs, srun_mpi(listing.stdout + listing.stderr), cfg.command)

    def interface(self) -> str | None:
        """``--network-interface`` only (Open MPI's ranks choose theirs), and the run's one line, once."""
        cfg = self.cfg
        if self.restart == 0 and cfg.allocation is not None:
            nodes = ",".join(h for h, _ in cfg.hosts[: min(len(cfg.hosts), cfg.nprocs)])
            say(f"inside Slurm job {cfg.allocation.job_id}: {cfg.nprocs} worker(s) over {nodes} through srun "
                "(--local: this node only)")  # fmt: skip
        return cfg.network_interface


class NodefileGroup(RemoteGroup):
    """Workers over a PBS job's nodes: Open MPI's mpiexec with the job's node file."""

    def argv(self, launcher: str, names: list[str]) -> list[str]:
        cfg = self.cfg
        assert cfg.allocation is not None and cfg.allocation.nodefile
        argv = remote_argv(launcher, cfg.hosts, cfg.nprocs, cfg.command, names, cfg.mpi_args)
        at = argv.index("--host")
        argv[at : at + 2] = ["--hostfile", cfg.allocation.nodefile]
        return argv

    def interface(self) -> str | None:
        cfg = self.cfg
        if self.restart == 0 and cfg.allocation is not None:
            say(f"inside PBS job {cfg.allocation.job_id}: {cfg.nprocs} worker(s) over the node file "
                f"{cfg.allocation.nodefile} through mpiexec (--local: this node only)")  # fmt: skip
        return super().interface()


#: The group that starts the workers of each scheduler's allocation.
GROUPS: dict[str, type[RemoteGroup]] = {"slurm": SrunGroup, "pbs": NodefileGroup}
#: Allocations whose launcher is not mpiexec: no Open MPI mpiexec is needed to start the workers.
SRUN_STARTED = frozenset({"slurm"})
