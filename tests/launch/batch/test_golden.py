"""Golden rendered scripts: any change to a template shows as a diff of tests/golden/.

Three kinds, each file named for what it shows:

- ``slurm.sh``, ``pbs.sh``, ``cobalt.sh``: one rich spec per scheduler (geometry, GPUs where the
  scheduler has them, requeue with grace, ``module purge`` and loads, ``--env-source``, ``--wrap``,
  job-time ``${NAME}`` in ``--env`` beside a quote and a literal ``$$``; Slurm with a pulled
  ``docker://`` image, ``--container-args`` and the submitting mldist bound in; PBS with threads
  measured when the job starts; Cobalt with hyper-threads).
- ``site-NAME.sh``: every built-in site profile exactly as ``mldist submit --site NAME --nodes 2
  --time 1:00:00 --output-dir /scratch/u/run -- python train.py`` writes it (the real parser and
  ``build_spec``; user and project site files kept out).
- ``launcher-NAME.sh``: every launcher, including Cobalt + Open MPI with 8 GPUs (ThetaGPU) and PBS
  with Open MPI and Hydra (the node file).

Besides the diff, small tests below state each guide's key lines directly. After an intended
template change, regenerate and review:

    MLDIST_UPDATE_GOLDEN=1 pytest tests/launch/batch/test_golden.py
    git diff tests/golden/
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import TESTS
from mldist.cli import build_parser
from mldist.cli.common import command_after_dashes
from mldist.launch.batch.build import build_spec
from mldist.launch.batch.launchers import LAUNCHERS, launcher_name
from mldist.launch.batch.render import render
from mldist.launch.batch.sites import BUILTIN
from mldist.launch.batch.spec import JobSpec

GOLDEN = TESTS / "golden"
UPDATE = "MLDIST_UPDATE_GOLDEN"
#: A fixed submit time (only used for a default output directory; the goldens name theirs).
NOW = 1_700_000_000.0
#: Where the submitting mldist is said to live in the Slurm golden (build_spec would use the checkout's).
MLDIST_PATH = "/home/u/.local/lib/python3.11/site-packages/mldist"

COMMON: dict[str, Any] = dict(
    command=("python", "train.py", "--epochs", "5"),
    job_name="golden",
    nodes=2,
    tasks_per_node=4,
    time="2:00:00",
    requeue=True,
    grace=120,
    module_purge=True,
    modules=("gcc/12.2", "cuda/12.2"),
    env_source=("/opt/intel/vtune/amplxe-vars.sh",),
    env=(
        ("NCCL_DEBUG", "INFO"),
        ("XLA_FLAGS", "--xla_gpu_cuda_data_dir=${CUDA_PATH}"),
        ("LD_LIBRARY_PATH", "$LD_LIBRARY_PATH:/opt/intel/vtune/lib64"),
        ("RUN_NOTE", "it's $HOME; costs $$5 & $$(id) *"),
    ),
    wrap=("nsys", "profile", "-o", "{job_dir}/r{rank}", "--"),
    account="proj1",
    output_dir="/scratch/u/run",
)

SPECS: dict[str, JobSpec] = {
    "slurm": JobSpec(
        **COMMON,
        scheduler="slurm",
        gpus_per_node=4,
        cpus_per_task=8,
        mem="64G",
        queue="gpu",
        dependency="afterok:123",
        container="docker://tensorflow/tensorflow:2.16.1-gpu",
        container_args=("--writable-tmpfs", "--bind", "/scratch/u/data:/data:ro"),
        binds=("/data:/mnt:ro",),
        mldist_path=MLDIST_PATH,
    ),
    # No cpus_per_task and no cores_per_node: the job measures the node's cores when it starts.
    "pbs": JobSpec(
        **COMMON,
        scheduler="pbs",
        gpus_per_node=4,
        queue="prod",
        dependency="afterok:12.pbs",
        venv="/home/u/venvs/tf",
        directives=("-l filesystems=home:eagle",),
    ),
    "cobalt": JobSpec(
        **COMMON,
        scheduler="cobalt",
        cores_per_node=64,
        hyperthreads=2,
        queue="debug-cache-quad",
        dependency="1234:1235",
        constraint="mcdram=cache:numa=quad",
        container="/sw/images/tf.sif",
    ),
}

_LAUNCH: dict[str, Any] = dict(command=("python", "train.py"), nodes=2, time="1:00:00", output_dir="/scratch/u/run")

#: One script per launcher; the name says the scheduler when the launcher is not the scheduler's own.
LAUNCHER_SPECS: dict[str, JobSpec] = {
    "srun": JobSpec(**_LAUNCH, scheduler="slurm", tasks_per_node=4, gpus_per_node=4, cpus_per_task=16),
    "aprun": JobSpec(**_LAUNCH, scheduler="cobalt", launcher="aprun", tasks_per_node=4, hyperthreads=2),
    "pals": JobSpec(**_LAUNCH, scheduler="pbs", launcher="pals", tasks_per_node=4, cores_per_node=32),
    # The ThetaGPU line: Cobalt, Open MPI's mpirun, 8 GPUs per node (one rank each).
    "openmpi": JobSpec(
        **_LAUNCH, scheduler="cobalt", launcher="openmpi", gpus_per_node=8, cores_per_node=128, queue="full-node"
    ),
    "openmpi-pbs": JobSpec(**_LAUNCH, scheduler="pbs", launcher="openmpi", tasks_per_node=2),
    "openmpi-slurm": JobSpec(**_LAUNCH, scheduler="slurm", launcher="openmpi", tasks_per_node=4, cpus_per_task=8),
    "hydra": JobSpec(**_LAUNCH, scheduler="pbs", launcher="hydra", tasks_per_node=4, cores_per_node=64),
}


#: ``mldist submit --stage-env --dry-run`` per scheduler: a venv (Slurm: sbcast), a named conda environment in
#: /dev/shm (PBS: PALS mpiexec --ppn 1), a venv under a path of one's own (Cobalt: aprun -N 1).
STAGE_WORDS: dict[str, list[str]] = {
    "slurm": ["--venv", "/home/u/venvs/tf", "--nodes", "2", "--tasks-per-node", "4"],
    "pbs": ["--conda", "tf", "--stage-to", "shm", "--nodes", "2", "--tasks-per-node", "4", "--cores-per-node", "32"],
    "cobalt": ["--venv", "/home/u/venvs/tf", "--stage-to", "/local/scratch", "--nodes", "2", "--requeue"],
}


def stage_words(scheduler: str) -> list[str]:
    """The staged golden's command line (after ``mldist submit``)."""
    words = ["--scheduler", scheduler, "--stage-env", "--dry-run", *STAGE_WORDS[scheduler], "--time", "1:00:00"]
    return [*words, "--output-dir", "/scratch/u/run"]


@pytest.fixture
def no_site_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only the built-in profiles: no ~/.config/mldist/sites.toml, no ./mldist-sites.toml."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    yield


def submit_spec(*words: str) -> JobSpec:
    """The JobSpec of ``mldist submit WORDS`` (the real parser and build_spec, nothing submitted)."""
    parser, _ = build_parser()
    args = parser.parse_args(["submit", *words])
    return build_spec(vars(args), command_after_dashes(args.cmd, "python train.py"), now=NOW)


def site_words(name: str) -> list[str]:
    """The site golden's command line (after ``mldist submit``)."""
    return ["--site", name, "--nodes", "2", "--time", "1:00:00", "--output-dir", "/scratch/u/run"]


def site_script(name: str) -> str:
    """The script of the site golden's command line."""
    text: str = render(submit_spec(*site_words(name), "--", "python", "train.py"))
    return text


def expect_golden(stem: str, got: str, how: str) -> None:
    """Compare ``got`` with tests/golden/STEM.sh (rewrite it with MLDIST_UPDATE_GOLDEN=1)."""
    path = GOLDEN / f"{stem}.sh"
    if os.environ.get(UPDATE) == "1":
        path.write_text(got)
    want = path.read_text() if path.exists() else ""
    if got != want:
        diff = "".join(
            difflib.unified_diff(
                want.splitlines(keepends=True), got.splitlines(keepends=True), f"tests/golden/{stem}.sh", how
            )
        )
        pytest.fail(
            f"the rendered script differs from tests/golden/{stem}.sh:\n{diff}\n"
            f"If the change is intended, regenerate the files and review their diff:\n"
            f"  {UPDATE}=1 pytest tests/launch/batch/test_golden.py\n"
            f"  git diff tests/golden/",
            pytrace=False,
        )


@pytest.mark.parametrize("scheduler", sorted(SPECS))
def test_rendered_script_matches_the_golden_file(scheduler: str) -> None:
    expect_golden(scheduler, render(SPECS[scheduler]), f"render(SPECS[{scheduler!r}])")


@pytest.mark.usefixtures("no_site_files")
@pytest.mark.parametrize("site", sorted(BUILTIN))
def test_site_profile_script_matches_the_golden_file(site: str) -> None:
    how = f"mldist submit {' '.join(site_words(site))} -- python train.py"
    expect_golden(f"site-{site}", site_script(site), how)


@pytest.mark.parametrize("name", sorted(LAUNCHER_SPECS))
def test_launcher_script_matches_the_golden_file(name: str) -> None:
    expect_golden(f"launcher-{name}", render(LAUNCHER_SPECS[name]), f"render(LAUNCHER_SPECS[{name!r}])")


@pytest.mark.usefixtures("no_site_files")
@pytest.mark.parametrize("scheduler", sorted(STAGE_WORDS))
def test_staged_script_matches_the_golden_file(scheduler: str) -> None:
    words = stage_words(scheduler)
    script = render(submit_spec(*words, "--", "python", "train.py"))
    expect_golden(f"stage-{scheduler}", script, f"mldist submit {' '.join(words)} -- python train.py")


def test_every_scheduler_site_and_launcher_has_a_golden_script() -> None:
    from mldist.launch.batch.schedulers import SCHEDULERS

    assert sorted(SPECS) == sorted(SCHEDULERS) == sorted(STAGE_WORDS)
    assert {launcher_name(s) for s in LAUNCHER_SPECS.values()} == set(LAUNCHERS)
    want = {*SPECS, *(f"site-{n}" for n in BUILTIN), *(f"launcher-{n}" for n in LAUNCHER_SPECS)}
    want |= {f"stage-{n}" for n in STAGE_WORDS}
    assert sorted(p.stem for p in GOLDEN.glob("*.sh")) == sorted(want)


# The guides' key lines, stated directly (the golden files show them in context).


def launch_line(script: str) -> str:
    """The line that starts the ranks (the one running the rank wrapper)."""
    (line,) = [ln for ln in script.splitlines() if "mldist-rank" in ln and not ln.startswith("#")]
    return line.strip()


@pytest.mark.usefixtures("no_site_files")
def test_theta_is_the_guide_s_aprun_layout() -> None:
    script = site_script("theta")
    assert launch_line(script).startswith(
        "aprun -n 8 -N 4 -d 32 -j 2 -cc depth -e MLDIST_SIZE=8 -e MLDIST_LOCAL_SIZE=4 -e OMP_NUM_THREADS=32 "
        "-e KMP_BLOCKTIME=0 -e KMP_AFFINITY=granularity=fine,compact,1,0 bash -c "  # the guide passes them with -e
    )
    assert "export OMP_NUM_THREADS=32 MLDIST_CPUS_PER_TASK=32" in script.splitlines()
    assert "export KMP_BLOCKTIME=0" in script.splitlines()
    assert "export KMP_AFFINITY=granularity=fine,compact,1,0" in script.splitlines()
    assert "#COBALT --attrs mcdram=cache:numa=quad" in script
    assert "module purge" not in script  # it would unload the Cray environment aprun and mpi4py need


@pytest.mark.usefixtures("no_site_files")
def test_saga_asks_for_accel_gpus_per_task_and_memory_per_cpu() -> None:
    gpu = submit_spec("--site", "saga", "--gpus-per-node", "4", "--nodes", "2", "--output-dir", "/s/r", "python", "x")
    script = render(gpu)
    lines = script.splitlines()
    assert "#SBATCH --partition=accel" in lines
    assert "#SBATCH --gpus-per-task=1" in lines and "#SBATCH --ntasks-per-node=4" in lines
    assert "#SBATCH --mem-per-cpu=8G" in lines
    assert "--gpus-per-task=1" in launch_line(script)
    assert "export OMPI_MCA_btl='^openib'" in lines and "export OMPI_MCA_pml=ob1" in lines
    cpu = render(submit_spec("--site", "saga", "--nodes", "2", "--output-dir", "/s/r", "python", "x"))
    assert "#SBATCH --partition=normal" in cpu.splitlines() and "gpus" not in cpu


@pytest.mark.usefixtures("no_site_files")
def test_thetagpu_is_cobalt_with_open_mpi_and_eight_gpus() -> None:
    script = site_script("thetagpu")
    assert launch_line(script).startswith(
        'mpirun -np 16 --map-by ppr:8:node:PE=16 --bind-to core --hostfile "$COBALT_NODEFILE" '
        '${mldist_forward[@]+"${mldist_forward[@]}"} bash -c '
    )
    assert "#COBALT -q full-node" in script and "#COBALT -t 60" in script
    assert "export OMP_NUM_THREADS=16 MLDIST_CPUS_PER_TASK=16" in script.splitlines()


@pytest.mark.usefixtures("no_site_files")
def test_polaris_is_pbs_with_pals_mpiexec() -> None:
    script = site_script("polaris")
    assert launch_line(script).startswith("mpiexec -n 8 --ppn 4 --depth 16 --cpu-bind depth bash -c ")
    lines = script.splitlines()
    assert "#PBS -l select=2:ncpus=64:mpiprocs=4:ngpus=4" in lines
    assert "#PBS -l filesystems=home:eagle" in lines
    assert "export NCCL_NET='AWS Libfabric'" in lines and "export TMPDIR=/tmp" in lines
    assert "module purge" not in script


@pytest.mark.usefixtures("no_site_files")
def test_no_script_pins_one_thread_per_rank_unless_asked() -> None:
    scripts = {f"site-{n}": site_script(n) for n in BUILTIN}
    scripts.update({n: render(s) for n, s in SPECS.items()})
    scripts.update({f"launcher-{n}": render(s) for n, s in LAUNCHER_SPECS.items()})
    for name, script in scripts.items():
        assert not re.search(r"OMP_NUM_THREADS=1\b", script), name
        assert not re.search(r"MLDIST_CPUS_PER_TASK=1\b", script), name
        assert "-d 1 " not in script, name
    asked = render(submit_spec("--site", "theta", "--cpus-per-task", "1", "--output-dir", "/s/r", "python", "x"))
    assert "export OMP_NUM_THREADS=1 MLDIST_CPUS_PER_TASK=1" in asked.splitlines()


def test_measured_threads_fill_the_node_when_nothing_says_how_many() -> None:
    script = render(SPECS["pbs"])
    assert "#PBS -l select=2:mpiprocs=4:ngpus=4" in script and "#PBS -l place=scatter:excl" in script
    assert "export MLDIST_CPUS_PER_TASK=$((mldist_cpus / 4 > 0 ? mldist_cpus / 4 : 1))" in script
    assert '--depth "$MLDIST_CPUS_PER_TASK"' in launch_line(script)


def test_the_scheduler_goldens_show_the_new_recipe_lines() -> None:
    slurm = render(SPECS["slurm"])
    lines = slurm.splitlines()
    assert "module purge" in lines
    assert "set +u; source /opt/intel/vtune/amplxe-vars.sh; set -u" in lines
    assert 'export XLA_FLAGS=--xla_gpu_cuda_data_dir="${CUDA_PATH-}"' in lines
    assert 'export LD_LIBRARY_PATH="${LD_LIBRARY_PATH-}":/opt/intel/vtune/lib64' in lines
    assert "costs $5 & $(id) *'" in slurm  # $$ is one literal $; the rest is inert
    assert "apptainer pull --force" in slurm and "docker://tensorflow/tensorflow:2.16.1-gpu" in slurm
    assert f"mldist_binds=(--bind {MLDIST_PATH}:/opt/mldist-host/mldist:ro)" in slurm
    line = launch_line(slurm)
    assert "mldist-rank 5 nsys profile -o '{job_dir}/r{rank}' -- apptainer exec --nv" in line
    assert '--writable-tmpfs --bind /scratch/u/data:/data:ro "$mldist_sif" python train.py --epochs 5 &' in line
    # The preemption timer (PBS, Cobalt) is armed before the modules load.
    for name in ("pbs", "cobalt"):
        text = render(SPECS[name])
        assert text.index("kill -USR1 $$ ) & watcher=$!") < text.index("module purge"), name
    assert "aprun -n 8 -N 4 -d 32 -j 2 -cc depth" in render(SPECS["cobalt"])
