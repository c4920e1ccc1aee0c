"""Each centre guide's job recipe as one ``mldist submit --dry-run`` line, through the real CLI.

These command lines are the documentation site's (docs/sites/index.md): each runs ``python -m mldist`` in a
subprocess, in an empty working directory with no user site file and no scheduler on PATH (a
laptop), and the test checks the lines of the printed script that make the recipe. Bad input
gets exit 2 and one stderr line.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from helpers import clean_env, mldist, tail

#: The guides' recipes: (id, the command line after ``mldist``, lines the script must hold).
RECIPES: list[tuple[str, str, list[str]]] = [
    (
        "theta",
        "submit --site theta --nodes 8 --time 1:00:00 --dry-run -- python train.py",
        [
            "#COBALT -n 8",
            "#COBALT --attrs mcdram=cache:numa=quad",
            "export OMP_NUM_THREADS=32 MLDIST_CPUS_PER_TASK=32",
            "export KMP_BLOCKTIME=0",
            "aprun -n 32 -N 4 -d 32 -j 2 -cc depth -e MLDIST_SIZE=32 -e MLDIST_LOCAL_SIZE=4 -e OMP_NUM_THREADS=32 "
            "-e KMP_BLOCKTIME=0 ",
        ],
    ),
    (
        "thetagpu",
        "submit --site thetagpu --nodes 2 --time 1:00:00 --dry-run -- python train.py",
        [
            "#COBALT -q full-node",
            "export OMP_NUM_THREADS=16 MLDIST_CPUS_PER_TASK=16",
            'mpirun -np 16 --map-by ppr:8:node:PE=16 --bind-to core --hostfile "$COBALT_NODEFILE" ',
        ],
    ),
    (
        "polaris",
        "submit --site polaris --nodes 2 --time 1:00:00 --queue debug --account MYPROJ --dry-run -- python train.py",
        [
            "#PBS -l select=2:ncpus=64:mpiprocs=4:ngpus=4",
            "#PBS -q debug",
            "#PBS -A MYPROJ",
            "#PBS -l filesystems=home:eagle",
            "export NCCL_NET='AWS Libfabric'",
            "mpiexec -n 8 --ppn 4 --depth 16 --cpu-bind depth ",
        ],
    ),
    (
        "saga-horovod",
        "submit --site saga --gpus-per-node 4 --nodes 2 --dry-run -- python train.py",
        [
            "#SBATCH --partition=accel",
            "#SBATCH --gpus-per-task=1",
            "#SBATCH --mem-per-cpu=8G",
            "module purge",
            "export OMPI_MCA_btl='^openib'",
            "srun --kill-on-bad-exit=1 --nodes=2 --ntasks=8 --ntasks-per-node=4 ",
        ],
    ),
    (
        "saga-mirrored",
        "submit --site saga --gpus-per-node 4 --tasks-per-node 1 --gpu-request total --dry-run -- python train.py",
        ["#SBATCH --partition=accel", "#SBATCH --gpus=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --mem-per-cpu=8G"],
    ),
    (
        "alps",
        "submit --site alps --nodes 2 --time 1:00:00 --dry-run -- python train.py",
        ["#SBATCH --gpus-per-node=4", "export NCCL_PROTO='^LL128'", "--gpus-per-task=1"],
    ),
    (
        "frontier",
        "submit --site frontier --nodes 2 --time 1:00:00 --dry-run -- python train.py",
        ["#SBATCH --cpus-per-task=7", "srun --kill-on-bad-exit=1 --nodes=2 --ntasks=16 --ntasks-per-node=8 "],
    ),
    (
        "perlmutter",
        "submit --site perlmutter --nodes 2 --time 1:00:00 --dry-run -- python train.py",
        ["#SBATCH --constraint=gpu", "#SBATCH --gpus-per-node=4", "export FI_MR_CACHE_MONITOR=userfaultfd"],
    ),
    (
        "apptainer",
        "submit --site apptainer-slurm --container docker://tensorflow/tensorflow:2.16.1-gpu --gpus-per-node 4"
        " --nodes 2 --dry-run -- python train.py",
        [
            "unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY",
            'export APPTAINER_CACHEDIR="${APPTAINER_CACHEDIR:-${TMPDIR:-/tmp}/apptainer-cache-$(id -u)}"',
            'mldist_sif="$MLDIST_JOB_DIR/tensorflow_tensorflow_2.16.1-gpu.sif"',
            "apptainer pull --force",
            "mldist_binds=(--bind ",
            'apptainer exec --nv --bind "$PWD" --bind "$MLDIST_JOB_DIR" ${mldist_binds[@]+"${mldist_binds[@]}"} '
            '"$mldist_sif" python train.py &',
        ],
    ),
    (
        "xla-cuda-module",
        "submit --module cuda/12.2 --env 'XLA_FLAGS=--xla_gpu_cuda_data_dir=${CUDA_PATH}'"
        " --gpus-per-node 4 --dry-run -- python train.py",
        ["module load cuda/12.2", 'export XLA_FLAGS=--xla_gpu_cuda_data_dir="${CUDA_PATH-}"'],
    ),
    (
        "vtune",
        "submit --wrap 'vtune -collect hotspots -r {job_dir}/vtune-{rank} --'"
        " --env-source {vars} --env 'LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/opt/intel/vtune/lib64'"
        " --dry-run -- python train.py",
        [
            "set +u; source {vars}; set -u",
            'export LD_LIBRARY_PATH="${LD_LIBRARY_PATH-}":/opt/intel/vtune/lib64',
            "mldist-rank 6 vtune -collect hotspots -r '{job_dir}/vtune-{rank}' -- python train.py &",
        ],
    ),
    (
        "nsys-openmpi-pbs",
        "submit --scheduler pbs --launcher openmpi --nodes 2 --tasks-per-node 4 --cores-per-node 64"
        " --wrap 'nsys profile -o {job_dir}/r{rank}' --dry-run -- python train.py",
        [
            "#PBS -l select=2:ncpus=64:mpiprocs=4",
            'mpirun -np 8 --map-by ppr:4:node:PE=16 --bind-to core --hostfile "$PBS_NODEFILE" ',
            "mldist-rank 4 nsys profile -o '{job_dir}/r{rank}' python train.py &",
        ],
    ),
]

#: Bad input: (id, the words after ``mldist submit --scheduler slurm --dry-run``, what the one line says).
BAD: list[tuple[str, list[str], str]] = [
    ("env-command-substitution", ["--env", "A=$(id)"], "command substitution $(...) is refused"),
    ("env-backtick", ["--env", "A=`id`"], "has a backtick (command substitution) and is refused"),
    ("env-default-expansion", ["--env", "A=${B:-x}"], "the expansion ${B:-x} is refused"),
    ("wrap-unknown-placeholder", ["--wrap", "{nope}"], "unknown placeholder {nope}"),
    ("wrap-unbalanced-quote", ["--wrap", "nsys 'profile"], "cannot be split into words"),
    ("launcher-bogus", ["--launcher", "bogus"], "invalid choice: 'bogus'"),
    ("container-quote", ["--container", 'docker://bad"quote'], "is refused: give a local .sif path or docker://"),
    ("gpu-request-bogus", ["--gpu-request", "some"], "invalid choice: 'some'"),
    ("gpu-per-task-mismatch", ["--site", "saga", "--gpus-per-node", "4", "--tasks-per-node", "1"], "must equal"),
    ("mem-per-cpu-on-pbs", ["--scheduler", "pbs", "--mem-per-cpu", "4G"], "--mem-per-cpu is Slurm's"),
    ("aprun-with-gpus", ["--site", "theta", "--scheduler", "cobalt", "--gpus-per-node", "8"], "--launcher openmpi"),
]


#: What a dry run says, in one stderr line, when it had to choose the scheduler itself.
NO_SCHEDULER = (
    "mldist submit: note: no scheduler found here; the dry run renders for slurm (or give --scheduler pbs|cobalt)\n"
)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """An empty working directory (no ./mldist-sites.toml) with a vendor setup script in it."""
    (tmp_path / "amplxe-vars.sh").write_text("export VTUNE_PROFILER_DIR=/opt/intel/vtune\n")
    (tmp_path / "empty-bin").mkdir()
    return tmp_path


def submit(argv: list[str], workdir: Path) -> subprocess.CompletedProcess[str]:
    """``mldist ARGV`` in ``workdir`` with no user site file and no scheduler on PATH."""
    env = clean_env(XDG_CONFIG_HOME=str(workdir / "config"), HOME=str(workdir), PATH=str(workdir / "empty-bin"))
    res: subprocess.CompletedProcess[str] = mldist(argv, timeout=60, cwd=workdir, env=env)
    return res


@pytest.mark.parametrize(("line", "want"), [(r[1], r[2]) for r in RECIPES], ids=[r[0] for r in RECIPES])
def test_a_guide_recipe_is_one_submit_line(workdir: Path, line: str, want: list[str]) -> None:
    vars_sh = str(workdir / "amplxe-vars.sh")
    argv = shlex.split(line.replace("{vars}", vars_sh))
    res = submit(argv, workdir)
    chosen = any(a in ("--site", "--scheduler") for a in argv)
    assert res.returncode == 0 and res.stderr == ("" if chosen else NO_SCHEDULER), tail(res)
    script = res.stdout
    assert script.startswith("#!/bin/bash\n"), tail(res)
    for text in want:
        text = text.replace("{vars}", vars_sh)
        if text.startswith("#") or text.startswith("export ") or text.startswith("set +u") or text == "module purge":
            assert text in script.splitlines(), f"missing line {text!r}\n{tail(res)}"
        else:
            assert text in script, f"missing {text!r}\n{tail(res)}"
    assert not (workdir / "mldist-jobs").exists()  # a dry run writes nothing
    assert "OMP_NUM_THREADS=1 " not in script and "MLDIST_CPUS_PER_TASK=1\n" not in script  # threads fill the node


@pytest.mark.parametrize(("words", "message"), [(b[1], b[2]) for b in BAD], ids=[b[0] for b in BAD])
def test_bad_recipe_input_is_one_line_and_exit_2(workdir: Path, words: list[str], message: str) -> None:
    res = submit(["submit", "--scheduler", "slurm", "--dry-run", *words, "--", "python", "train.py"], workdir)
    assert res.returncode == 2, tail(res)
    assert res.stdout == "", tail(res)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mldist submit: error: "), tail(res)
    assert message in lines[0], tail(res)
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("words", "directive", "stderr"),
    [([], "#SBATCH --nodes=1", NO_SCHEDULER), (["--scheduler", "pbs"], "#PBS -l select=1:mpiprocs=1", "")],
    ids=["slurm-by-default", "scheduler-pbs"],
)
def test_a_dry_run_needs_no_scheduler(workdir: Path, words: list[str], directive: str, stderr: str) -> None:
    res = submit(["submit", "--dry-run", *words, "--", "python", "train.py"], workdir)
    assert res.returncode == 0 and res.stderr == stderr, tail(res)
    assert directive in res.stdout.splitlines(), tail(res)
    assert not (workdir / "mldist-jobs").exists()  # a dry run writes nothing
    real = submit(["submit", *words, "--", "python", "train.py"], workdir)  # submitting still needs one
    assert real.returncode == 2 and real.stdout == "", tail(real)
    assert len(real.stderr.splitlines()) == 1 and "Traceback" not in real.stderr, tail(real)
    assert list(workdir.glob("mldist-jobs/*")) == []  # a failed submission leaves no job directory


def test_missing_local_files_warn_in_a_dry_run_and_stop_a_submission(workdir: Path) -> None:
    venv, source, cmd = ["--venv", "no-venv"], ["--env-source", "/missing/vars.sh"], ["--", "python", "t.py"]
    res = submit(["submit", "--scheduler", "slurm", "--dry-run", *venv, *source, *cmd], workdir)
    assert res.returncode == 0, tail(res)
    assert res.stderr.splitlines() == [
        f"mldist submit: warning: --venv '{workdir}/no-venv' has no bin/activate; create it (mldist build-env)"
        " or fix the path (a dry run goes on; submitting stops here)",
        "mldist submit: warning: --env-source '/missing/vars.sh' is not a file; give the setup script's path"
        " (a dry run goes on; submitting stops here)",
    ]
    assert "set +u; source /missing/vars.sh; set -u" in res.stdout.splitlines(), tail(res)
    for words, flag in (([*venv, *source], "--venv"), (source, "--env-source")):
        real = submit(["submit", "--scheduler", "slurm", *words, *cmd], workdir)
        assert real.returncode == 2 and real.stdout == "", tail(real)
        (line,) = real.stderr.splitlines()
        assert line.startswith(f"mldist submit: error: {flag} ") and "Traceback" not in real.stderr
    assert not (workdir / "mldist-jobs").exists()  # refused before anything was written
