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

import atexit
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import ConfigError, LaunchError
from .batch.staging import ARCHIVE, STAGE_ROOTS, STAGED_WRAPPER, UNPACK
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


#: Staged environments of this process, by (per-node step, node-local root): one copy per node per run.
_STAGED: dict[tuple[tuple[str, ...], str], str] = {}


def stage_root(stage_to: str, env: Mapping[str, str]) -> str:
    """The node-local directory of ``--stage-to`` (``tmpdir``: this process's ``$TMPDIR``, else /tmp)."""
    return (env.get("TMPDIR") or "/tmp") if stage_to == "tmpdir" else STAGE_ROOTS.get(stage_to, stage_to)


def _step(argv: Sequence[str], what: str, hint: str = "") -> None:
    """Run one staging step; its failure is one line (ConfigError: exit 2) naming the step."""
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"--stage-env: {what} did not run: {exc}") from None
    if res.returncode != 0:  # the unpack program's own line if it said one, else the tool's last
        lines = [line.strip() for line in (res.stderr + res.stdout).splitlines() if line.strip()]
        lines = [line for line in lines if line.startswith("mldist:")] or lines or [f"exit {res.returncode}"]
        raise ConfigError(f"--stage-env: {what} failed: {lines[-1]}{hint}")


def stage(per_node: Sequence[str], root: str, name: str, folder: str, sbcast: bool) -> str:
    """This Python's environment on every node, once: pack it into ``folder``, send it (``sbcast``, else each
    node's one task reads it there), unpack it under ``stage_to``; the staged directory.

    Args:
        per_node: argv starting one task on each node (srun ``--ntasks-per-node=1``, mpiexec ``ppr:1:node``).
        root: the node-local directory (:func:`stage_root`).
        name: what makes the staged directory this run's (the job id).
        folder: where the archive goes (the run directory; with ``sbcast`` it need not be shared).
        sbcast: Slurm: broadcast the archive first.
    """
    key = (tuple(per_node), root)
    if key in _STAGED:
        return _STAGED[key]
    prefix = sys.prefix
    if not ((Path(prefix) / "pyvenv.cfg").is_file() or (Path(prefix) / "conda-meta").is_dir()):
        raise ConfigError(f"--stage-env: this Python ({prefix}) is no venv or conda environment; run mldist from one")
    started, archive = time.monotonic(), Path(folder) / ARCHIVE
    staged = f"{root}/mldist-env-{name}-{os.getpid()}"
    archive.parent.mkdir(parents=True, exist_ok=True)
    _step(["tar", "-C", prefix, "-cf", str(archive), "."], f"packing {prefix} into {archive}")
    source = f"{staged}.tar" if sbcast else str(archive)
    if sbcast:
        where = "; give --stage-to a node-local directory every node can write (tmp, shm or a path)"
        _step(["sbcast", "--force", str(archive), source], f"sbcast of {archive} to {source}", where)
    _step(
        [*per_node, "bash", "-c", UNPACK, "mldist-unpack", staged, source, prefix, "1" if sbcast else "0"], "unpacking"
    )
    say(f"staged {prefix} at {staged} on every node in {time.monotonic() - started:.1f} s (--stage-env)")
    unstage = [*per_node, "bash", "-c", 'rm -rf -- "$1"', "mldist-unstage", staged]  # node-local space back at exit
    atexit.register(subprocess.run, unstage, capture_output=True, timeout=300, check=False)
    _STAGED[key] = staged
    return staged


def staged_argv(argv: list[str], staged: str) -> list[str]:
    """``argv`` with this Python (the shim's) replaced by the staged one, behind the staged wrapper."""
    at = argv.index(sys.executable)
    python = staged + sys.executable[len(sys.prefix) :] if sys.executable.startswith(sys.prefix + "/") else "python3"
    wrapper = ["/bin/bash", "-c", STAGED_WRAPPER, "mldist-staged", staged, sys.prefix]
    return [*argv[:at], *wrapper, python, *argv[at + 1 :]]


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
        argv = srun_argv(nodes, cfg.nprocs, srun_mpi(listing.stdout + listing.stderr), cfg.command)
        if cfg.stage_to is None:
            return argv
        step = ["srun", f"--nodes={len(cfg.hosts)}", f"--ntasks={len(cfg.hosts)}", "--ntasks-per-node=1"]
        folder = cfg.run_dir or self.env.get("TMPDIR") or "/tmp"  # sbcast reads it here: no need to share it
        root = stage_root(cfg.stage_to, self.env)
        job = cfg.allocation.job_id if cfg.allocation is not None else "run"
        return staged_argv(argv, stage(step, root, job, folder, sbcast=True))

    def interface(self) -> str | None:
        """``--network-interface`` only (Open MPI's ranks choose theirs), and the run's one line, once."""
        cfg = self.cfg
        if self.restart == 0 and cfg.allocation is not None:
            nodes = ",".join(h for h, _ in cfg.hosts[: min(len(cfg.hosts), cfg.nprocs)])
            say(
                f"inside Slurm job {cfg.allocation.job_id}: {cfg.nprocs} worker(s) over {nodes} through srun "
                "(--local: this node only)"
            )
        return cfg.network_interface


class NodefileGroup(RemoteGroup):
    """Workers over a PBS job's nodes: Open MPI's mpiexec with the job's node file."""

    def argv(self, launcher: str, names: list[str]) -> list[str]:
        cfg = self.cfg
        assert cfg.allocation is not None and cfg.allocation.nodefile
        argv = remote_argv(launcher, cfg.hosts, cfg.nprocs, cfg.command, names, cfg.mpi_args)
        at = argv.index("--host")
        argv[at : at + 2] = ["--hostfile", cfg.allocation.nodefile]
        if cfg.stage_to is None:
            return argv
        n = str(len(cfg.hosts))
        step = [launcher, "--hostfile", cfg.allocation.nodefile, "--map-by", "ppr:1:node", "-np", n]
        if not cfg.run_dir:
            raise ConfigError("--stage-env under PBS needs the run directory (the nodes read the archive there)")
        root = stage_root(cfg.stage_to, self.env)
        return staged_argv(argv, stage(step, root, cfg.allocation.job_id, cfg.run_dir, sbcast=False))

    def interface(self) -> str | None:
        cfg = self.cfg
        if self.restart == 0 and cfg.allocation is not None:
            say(
                f"inside PBS job {cfg.allocation.job_id}: {cfg.nprocs} worker(s) over the node file "
                f"{cfg.allocation.nodefile} through mpiexec (--local: this node only)"
            )
        return super().interface()


#: The group that starts the workers of each scheduler's allocation.
GROUPS: dict[str, type[RemoteGroup]] = {"slurm": SrunGroup, "pbs": NodefileGroup}
#: Allocations whose launcher is not mpiexec: no Open MPI mpiexec is needed to start the workers.
SRUN_STARTED = frozenset({"slurm"})
