"""Staged environments (``--stage-env``): the job's venv or conda environment on node-local storage.

Pure: a spec in, script lines out. At 10,000 ranks the start-up of Python is a metadata storm on the
shared file system (one worker's ``import`` of TensorFlow: ~34,500 file-system calls). Staged, the
environment is read from there once per node instead of once per rank:

1. the batch script packs the environment into one archive in the job directory (``env-stage.tar``,
   made once; a requeued attempt reuses it);
2. the archive reaches every node once: ``sbcast`` on Slurm (Slurm's own tree broadcast, one read of
   the shared file system), else a one-task-per-node step of the job's launcher reads it
   (``aprun -N 1``, PALS ``mpiexec --ppn 1``, ``mpirun --map-by ppr:1:node``, Hydra ``-ppn 1``);
3. that step unpacks it under the node-local directory (``--stage-to``: ``tmpdir`` is ``$TMPDIR`` or
   /tmp, ``tmp``, ``shm`` is /dev/shm, or an absolute path) as ``mldist-env-JOBID`` and points the
   ``#!`` lines of ``bin/`` scripts that named the original environment's interpreter at the staged one;
4. every rank runs through :data:`STAGED_WRAPPER`, which puts the staged ``bin`` first on ``PATH``,
   rewrites entries of ``PATH``, ``PYTHONPATH`` and ``LD_LIBRARY_PATH`` under the original prefix, sets
   ``VIRTUAL_ENV`` (venv) or ``CONDA_PREFIX`` (conda) and ``exec``\\ s the command;
5. after the step, the staged copies are removed (one more step per node).

What it relies on: a venv's ``bin/python`` is a link to its base interpreter (``pyvenv.cfg``'s
``home``), which must be at the same path on the nodes (the system's or a module's Python; its
standard library is then read from there). A conda environment carries its own interpreter. Files
other than ``bin/`` scripts that hold the original prefix are left as they are (``conda-pack`` rewrites
those).

Example:
    >>> from mldist.launch.batch.spec import JobSpec
    >>> s = JobSpec(command=("python", "t.py"), venv="/w/tf", stage_env=True, stage_path="/w/tf", stage_to="shm")
    >>> stage_root(s)
    '/dev/shm'
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

from ...base import envvalues
from ...errors import ConfigError
from .launchers import Shell, launcher_name
from .schedulers import scheduler
from .spec import JobSpec

q = shlex.quote

#: ``--stage-to`` names and the directory each is on a node (the batch script's value, used on every node).
STAGE_ROOTS = {"tmpdir": "${TMPDIR:-/tmp}", "tmp": "/tmp", "shm": "/dev/shm"}
#: An absolute ``--stage-to`` path (matched whole; it is written into the script quoted all the same).
STAGE_PATH = re.compile(r"/[A-Za-z0-9_.+@%=,:/-]*")
#: The archive in the job directory.
ARCHIVE = "env-stage.tar"

#: Runs once per node: $1 the staged directory, $2 the archive, $3 the original prefix, $4 1 to remove
#: the archive after. Unpacked beside, renamed into place when whole; #! lines naming "$3/bin/" name
#: "$1/bin/" after; where mldist is in it, its import finder for directories outside the environment
#: (:mod:`.listed_once`) goes into site-packages with a .pth line. Failures are one line and exit 2.
UNPACK = (
    'd=$1; a=$2; old=$3; h=$(hostname); say() { echo "mldist: --stage-env on $h: $*" >&2; }; '
    'rm -rf -- "$d" "$d.part"; '
    'mkdir -p -- "$d.part" 2>/dev/null || { say "cannot create $d.part: give --stage-to a node-local directory '
    'you can write (tmp, shm or a path)"; exit 2; }; '
    'tar -C "$d.part" -xf "$a" || { say "cannot unpack $a into $d.part (is it full?)"; rm -rf -- "$d.part"; exit 2; }; '
    'for f in "$d.part"/bin/*; do [ -f "$f" ] && [ ! -L "$f" ] || continue; '
    '[ "$(head -c 2 "$f")" = "#!" ] || continue; IFS= read -r first <"$f" 2>/dev/null || true; '
    'case "$first" in "#!$old/bin/"*) { printf "%s\\n" "#!$d/bin/${first#"#!$old/bin/"}"; tail -n +2 "$f"; } '
    '>"$f.mldist" && chmod --reference="$f" "$f.mldist" && mv -f "$f.mldist" "$f";; esac; done; '
    'for sp in "$d.part"/lib/python3*/site-packages; do s="$sp/mldist/launch/batch/listed_once.py"; '
    'if [ -f "$s" ]; then cp -- "$s" "$sp/_mldist_listed_once.py" && '
    'echo "import _mldist_listed_once" >"$sp/_mldist_listed_once.pth"; fi; done; '
    'mv -- "$d.part" "$d" || { say "cannot rename $d.part to $d"; exit 2; }; '
    'if [ "$4" = 1 ]; then rm -f -- "$a"; fi'
)

#: Runs each rank: $1 the staged directory, $2 the original prefix, then the command.
STAGED_WRAPPER = (
    'd=$1; old=$2; shift 2; for v in PATH PYTHONPATH LD_LIBRARY_PATH; do [ -n "${!v:-}" ] || continue; '
    'p=":${!v}:"; p=${p//":$old/"/":$d/"}; p=${p//":$old:"/":$d:"}; p=${p#:}; export "$v=${p%:}"; done; '
    'case ":$PATH:" in *":$d/bin:"*) ;; *) export PATH="$d/bin:$PATH";; esac; '
    'if [ -e "$d/pyvenv.cfg" ]; then export VIRTUAL_ENV="$d"; fi; '
    'if [ -d "$d/conda-meta" ]; then export CONDA_PREFIX="$d"; fi; '
    'exec "$@"'
)


def stage_root(s: JobSpec) -> str:
    """The node-local directory the environment is staged under, as the script writes it."""
    return STAGE_ROOTS.get(s.stage_to, s.stage_to)


def check_stage_to(text: str) -> None:
    """``--stage-to``: a name of :data:`STAGE_ROOTS` or an absolute path of plain characters (ConfigError if not)."""
    if text not in STAGE_ROOTS and not STAGE_PATH.fullmatch(text):
        raise ConfigError(
            f"--stage-to {text!r}: give tmpdir ($TMPDIR, else /tmp), tmp, shm (/dev/shm) or an "
            "absolute path of letters, digits and _.+@%=,:/-"
        )


def check_staging(s: JobSpec) -> None:
    """``--stage-env`` needs an environment, a node-local place and no container; ``--stage-to`` is a name or path.

    Example:
        >>> check_staging(JobSpec(command=("x",), stage_env=True, stage_path="/w/tf", stage_to="tmp/x"))
        Traceback (most recent call last):
        ...
        mldist.errors.ConfigError: --stage-to 'tmp/x': give tmpdir ($TMPDIR, else /tmp), tmp, shm (/dev/shm) or ...
    """
    check_stage_to(s.stage_to)
    if not s.stage_env:
        return
    if s.container:
        raise ConfigError("--stage-env with --container: the image is already one file per node; drop --stage-env")
    if s.stage_path is None and not s.conda:
        raise ConfigError("--stage-env: no environment to stage; give --venv PATH or --conda NAME")


def _source(s: JobSpec) -> str:
    """The original prefix as the script writes it: the path, or the activated conda environment's."""
    return q(s.stage_path) if s.stage_path else '"$CONDA_PREFIX"'


def per_node(s: JobSpec) -> list[str]:
    """argv words of a step with one task on every node of the job (Slurm: srun, else the job's launcher)."""
    n = str(s.nodes)
    if s.scheduler == "slurm":
        nodes = [Shell("--nodes=$SLURM_JOB_NUM_NODES"), Shell("--ntasks=$SLURM_JOB_NUM_NODES")]
        return ["srun", *nodes, "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    nodefile = Shell(f"${scheduler(s.scheduler).nodefile}")
    steps: dict[str, Callable[[], list[str]]] = {
        "aprun": lambda: ["aprun", "-n", n, "-N", "1", "-cc", "none"],
        "pals": lambda: ["mpiexec", "-n", n, "--ppn", "1"],
        "openmpi": lambda: ["mpirun", "-np", n, "--map-by", "ppr:1:node", "--hostfile", nodefile],
        "hydra": lambda: ["mpiexec", "-n", n, "-ppn", "1", "-f", nodefile],
    }
    return steps[launcher_name(s)]()


def stage_lines(s: JobSpec, word: Callable[[str], str]) -> list[str]:
    """Pack the environment once, bring it to every node once, unpack it there (nothing without ``--stage-env``).

    Args:
        s: the job.
        word: how the renderer writes one argv word (quoting).
    """
    if not s.stage_env:
        return []
    step = " ".join(word(a) for a in per_node(s))
    unpack = f"bash -c {q(UNPACK)} mldist-unpack"
    where = f'"{stage_root(s)}"' if "$" in stage_root(s) else q(stage_root(s))
    lines = [
        "# --stage-env: the environment on node-local storage, read from the shared file system once per node",
        f"mldist_stage_src={_source(s)}",
        f'mldist_stage={where}/mldist-env-"$job_id"',
        envvalues.shell('mldist_stage_tar="$@JOB_DIR@/' + ARCHIVE + '"'),
        'if [ -z "$mldist_stage_src" ] || [ ! -d "$mldist_stage_src/bin" ]; then',
        '  echo "mldist: --stage-env: $mldist_stage_src is no environment here (no bin/); give --venv or --conda" >&2',
        "  exit 2",
        "fi",
        "mldist_t0=$SECONDS",
        'if [ ! -s "$mldist_stage_tar" ]; then  # packed once; a requeued attempt reuses it',
        '  tar -C "$mldist_stage_src" -cf "$mldist_stage_tar.part-$$" . && mv -f "$mldist_stage_tar.part-$$" '
        '"$mldist_stage_tar" || { echo "mldist: --stage-env: cannot pack $mldist_stage_src into $mldist_stage_tar" '
        ">&2; exit 2; }",
        "fi",
    ]
    if s.scheduler == "slurm":  # Slurm's broadcast: the archive is read once, sent down a tree of the nodes
        lines += [
            'if ! sbcast --force "$mldist_stage_tar" "$mldist_stage.tar" 2>"$mldist_stage_tar.sbcast-err"; then',
            '  echo "mldist: --stage-env: sbcast cannot write $mldist_stage.tar on every node (why: '
            '$mldist_stage_tar.sbcast-err); give --stage-to a node-local directory you can write" >&2',
            "  exit 2",
            "fi",
            f'{step} {unpack} "$mldist_stage" "$mldist_stage.tar" "$mldist_stage_src" 1 || exit 2',
        ]
    else:  # one task per node reads the archive from the job directory
        lines.append(f'{step} {unpack} "$mldist_stage" "$mldist_stage_tar" "$mldist_stage_src" 0 || exit 2')
    lines.append('echo "mldist: staged $mldist_stage_src at $mldist_stage on every node in $((SECONDS - mldist_t0)) s"')
    return lines


def stage_prefix(s: JobSpec) -> list[str]:
    """Words before each rank's command: :data:`STAGED_WRAPPER` with the staged directory and the original prefix."""
    if not s.stage_env:
        return []
    # /bin/bash as the script's own #! line: a bare bash is looked up on PATH, whose first entries (the venv's
    # bin, ~/.local/bin, modules) are on the shared file system, by every rank.
    return ["/bin/bash", "-c", STAGED_WRAPPER, "mldist-staged", Shell("$mldist_stage"), Shell("$mldist_stage_src")]


def unstage_lines(s: JobSpec, word: Callable[[str], str]) -> list[str]:
    """After the step: the staged copies go (node-local space, RAM with ``shm``); the step's code stays."""
    if not s.stage_env:
        return []
    step = " ".join(word(a) for a in per_node(s))
    return [f'{step} bash -c \'rm -rf -- "$1"\' mldist-unstage "$mldist_stage" >/dev/null 2>&1 || true']
