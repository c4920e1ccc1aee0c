"""The centre guides' recipes run under the stand-ins: what each rank's argv and environment hold.

Threads that fill the node, job-time ``$NAME`` in ``--env`` (and hostile values that stay
inert), ``--env-source``, ``--wrap`` filled in per rank, ``module purge`` only when asked,
containers pulled once with the submitting mldist bound, Open MPI and Hydra launch lines,
and the save timer armed before the modules load.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import (
    CORES,
    NPROC,
    aprun_env,
    check_job_ran,
    make_job,
    measured,
    out_dir,
    rank_launches,
)
from mldist.errors import ConfigError
from mldist.launch.batch.expand import pieces, shell_word
from mldist.launch.batch.render import render
from mldist.launch.batch.spec import JobSpec

# -- --env values: job-time variables, nothing else -------------------------------------------------


@pytest.mark.parametrize(
    ("value", "what"),
    [
        ("$(id)", "command substitution"),
        ("`id`", "backtick"),
        ("a${HOME:-x}", "${HOME:-x}"),
        ("$1", "'$1'"),
        ("x$?", "'$?'"),
        ("cost: $", "'$'"),
        ("${A", "${A"),
        ("$ {A}", "'$ '"),
    ],
)
def test_shell_syntax_in_env_values_is_refused_in_one_line(value: str, what: str) -> None:
    with pytest.raises(ConfigError) as err:
        JobSpec(command=("x",), env=(("MY_V", value),))
    text = str(err.value)
    assert "\n" not in text and what in text and "$$" in text and text.startswith("MY_V: --env value")


def test_env_value_pieces() -> None:
    assert pieces("a$B${C}$$d") == [(False, "a"), (True, "B"), (True, "C"), (False, "$d")]
    assert shell_word("") == "''"
    assert shell_word("plain 'text'") == "'plain '\"'\"'text'\"'\"''"


@pytest.mark.slow  # runs the script under the stand-ins
def test_env_values_expand_when_the_job_starts_and_stay_inert(tmp_path: Path, standin_bin: Path) -> None:
    canary = tmp_path / "CANARY"
    hostile = f"$(touch {canary}) `touch {canary}` ; & \"'"
    source = tmp_path / "tool vars.sh"
    # Vendor setup scripts read unset variables: the job sources them with set +u.
    source.write_text('export MY_TOOL_HOME="/opt/tool $UNSET_IN_VENDOR_SCRIPT"\n')
    env = (
        ("XLA_FLAGS", "--xla_gpu_cuda_data_dir=${CUDA_PATH}"),
        ("LD_LIBRARY_PATH", "$LD_LIBRARY_PATH:/opt/intel/vtune/lib64"),
        ("MY_EVIL", "pre-$MY_HOSTILE-post"),
        ("MY_PRICE", "$$5 and $$(not run)"),
        ("MY_MISSING", "[$MY_NOT_SET]"),
        ("MY_FROM_SOURCE", "${MY_TOOL_HOME}/lib"),
    )
    job = make_job(
        tmp_path,
        standin_bin,
        output_dir=out_dir(tmp_path),
        tasks_per_node=2,
        env=env,
        env_source=(str(source),),
        job_env={"CUDA_PATH": "/sw/cuda 12.4", "LD_LIBRARY_PATH": "/sw/lib", "MY_HOSTILE": hostile},
    )
    job.run()
    assert not canary.exists(), "an expanded value was run as shell code"
    for task in job.calls("argv-recorder"):
        seen = task["env"]
        assert seen["XLA_FLAGS"] == "--xla_gpu_cuda_data_dir=/sw/cuda 12.4"
        assert seen["LD_LIBRARY_PATH"] == "/sw/lib:/opt/intel/vtune/lib64"
        assert seen["MY_EVIL"] == f"pre-{hostile}-post"
        assert seen["MY_PRICE"] == "$5 and $(not run)"
        assert seen["MY_MISSING"] == "[]"
        assert seen["MY_FROM_SOURCE"] == "/opt/tool /lib", "--env values come after --env-source"
    assert "mldist: --env MY_MISSING uses $MY_NOT_SET, which is not set in the job" in job.stdout
    check_job_ran(job, _srun(2, measured(2)), [])


def _srun(tasks: int, threads: int, nodes: int = 1) -> list[str]:
    return [
        *["--kill-on-bad-exit=1", f"--nodes={nodes}", f"--ntasks={nodes * tasks}", f"--ntasks-per-node={tasks}"],
        *[f"--cpus-per-task={threads}", "--cpu-bind=cores"],
    ]


# -- threads fill the node --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("tasks", "ht"), [(1, 1), (2, 1), (4, 2), (16, 1)])
def test_measured_threads_share_the_nodes_cores(tasks: int, ht: int, tmp_path: Path, standin_bin: Path) -> None:
    """No --cpus-per-task: cores x hyperthreads (within nproc) / ranks per node, measured on a compute node."""
    job = make_job(tmp_path, standin_bin, "cobalt", output_dir=out_dir(tmp_path), tasks_per_node=tasks, hyperthreads=ht)
    job.run()
    threads = measured(tasks, ht)
    assert threads == max(1, min(CORES * ht, NPROC) // tasks)
    launch = ["-n", str(tasks), "-N", str(tasks), "-d", str(threads), "-j", str(ht), "-cc", "depth"]
    check_job_ran(job, [*launch, *aprun_env(tasks, tasks, threads)], [])
    # ALPS: the batch script runs on a service node, so the cores are counted by one aprun'd rank.
    probes = [a for a in job.argvs("aprun") if "mldist-rank" not in a]
    # -cc none: aprun's default binding would show the probe one CPU.
    assert len(probes) == 1 and probes[0][:6] == ["-n", "1", "-N", "1", "-cc", "none"]
    assert {t["env"]["OMP_NUM_THREADS"] for t in job.calls("argv-recorder")} == {str(threads)}
    assert f"mldist: {min(CORES * ht, NPROC)} CPUs per node (measured)" in job.stdout


@pytest.mark.slow
def test_aprun_passes_the_job_s_variables_with_e_as_the_theta_guide_does(tmp_path: Path, standin_bin: Path) -> None:
    """ALPS: aprun -e NAME=VALUE for each --env (and site) variable, a $NAME value as its export expanded it."""
    env = (("KMP_BLOCKTIME", "0"), ("MY_A", "one $$ 'x' *"), ("MY_DIR", "$MLDIST_JOB_DIR/d"), ("MY_A", "two"))
    out = out_dir(tmp_path)
    job = make_job(tmp_path, standin_bin, "cobalt", output_dir=out, tasks_per_node=2, cpus_per_task=3, env=env)
    job.run()
    launch = ["-n", "2", "-N", "2", "-d", "3", "-j", "1", "-cc", "depth", *aprun_env(2, 2, 3)]
    job_vars = ["-e", "KMP_BLOCKTIME=0", "-e", "MY_A=two", "-e", f"MY_DIR={out}/d"]  # the last MY_A wins
    check_job_ran(job, [*launch, *job_vars], [])
    assert '-e KMP_BLOCKTIME=0 -e MY_A=two -e "MY_DIR=$MY_DIR" bash -c' in job.text
    for task in job.calls("argv-recorder"):
        assert (task["env"]["MY_A"], task["env"]["MY_DIR"]) == ("two", f"{out}/d")  # the stand-in records MY_*
    quoted = render(JobSpec(command=("python",), scheduler="cobalt", env=(("MY_A", "one $$ 'x' *"),), output_dir="/o"))
    assert """-e 'MY_A=one $ '"'"'x'"'"' *' bash -c""" in quoted  # a plain value: shlex-quoted, inert


def test_no_script_exports_one_thread_unless_asked() -> None:
    for scheduler in ("slurm", "pbs", "cobalt"):
        text = render(JobSpec(command=("python",), scheduler=scheduler, output_dir="/o"))
        assert "OMP_NUM_THREADS=1 " not in text and "MLDIST_CPUS_PER_TASK=1" not in text
        assert "export OMP_NUM_THREADS=$MLDIST_CPUS_PER_TASK" in text
    theta = render(
        JobSpec(command=("python",), scheduler="cobalt", tasks_per_node=4, cores_per_node=64, hyperthreads=2)
    )
    assert "aprun -n 4 -N 4 -d 32 -j 2 -cc depth" in theta and "export OMP_NUM_THREADS=32 " in theta


# -- --wrap, module purge ---------------------------------------------------------------------------


@pytest.mark.slow
def test_wrap_prefixes_each_rank_with_its_own_values(tmp_path: Path, standin_bin: Path) -> None:
    """``env`` plays the profiler: it runs the rank's command with the filled-in words as variables."""
    out = str(tmp_path / "out & $(x)")  # replacements stay literal (bash 5.2 reads & in ${a//p/r} as the match)
    wrap = ("env", "MY_PROFILE={job_dir}/vtune-{rank}-{local_rank}-{job_id}", "MY_LITERAL={rank")
    job = make_job(tmp_path, standin_bin, output_dir=out, nodes=2, tasks_per_node=2, cpus_per_task=1, wrap=wrap)
    job.run()
    got = sorted(
        (t["env"]["SLURM_PROCID"], t["env"]["MY_PROFILE"], t["env"]["MY_LITERAL"]) for t in job.calls("argv-recorder")
    )
    assert got == [(str(r), f"{out}/vtune-{r}-{r % 2}-4242", "{rank") for r in range(4)]
    launch = [*_srun(2, 1, nodes=2)]
    check_job_ran(job, launch, [])


def test_wrap_with_an_unknown_placeholder_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown placeholder \{node\}; known: \{rank\}"):
        JobSpec(command=("x",), wrap=("nsys", "-o", "{node}"))


@pytest.mark.slow
@pytest.mark.parametrize("purge", [False, True])
def test_module_purge_only_when_asked(purge: bool, tmp_path: Path, standin_bin: Path) -> None:
    kw = dict(output_dir=out_dir(tmp_path), modules=("PrgEnv-gnu", "cray-python"), module_purge=purge)
    job = make_job(tmp_path, standin_bin, "cobalt", **kw)
    assert job.run() == 0, job.explain()
    loads = [["load", "PrgEnv-gnu"], ["load", "cray-python"]]
    assert job.argvs("module") == [*([["purge"]] if purge else []), *loads, ["list"]]


# -- containers -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_docker_image_is_pulled_once_and_mldist_bound_when_missing(tmp_path: Path, standin_bin: Path) -> None:
    host_mldist = tmp_path / "site packages" / "mldist"
    host_mldist.mkdir(parents=True)
    kw = dict(
        output_dir=out_dir(tmp_path),
        container="docker://tensorflow/tensorflow:2.16.1-gpu",
        container_args=("--rocm", "-B", "/data"),
        mldist_path=str(host_mldist),
        tasks_per_node=2,
        cpus_per_task=2,
    )
    job = make_job(tmp_path, standin_bin, job_env={"STANDIN_NO_MLDIST": "1"}, **kw)
    job.run()
    sif = f"{out_dir(tmp_path)}/tensorflow_tensorflow_2.16.1-gpu.sif"
    pulls = [a for a in job.argvs("apptainer") if a[0] == "pull"]
    assert pulls == [["pull", "--force", f"{sif}.part-{job.proc.pid}", kw["container"]]]  # type: ignore[union-attr]
    assert Path(sif).read_text().startswith("SIF of docker://")
    bind = ["--bind", f"{host_mldist}:/opt/mldist-host/mldist:ro"]
    prefix = ["apptainer", "exec", "--bind", str(tmp_path / "work"), "--bind", out_dir(tmp_path), *bind]
    prefix += ["--rocm", "-B", "/data", sif]
    check_job_ran(job, _srun(2, 2), prefix)
    for task in job.calls("argv-recorder"):
        assert task["env"]["PYTHONPATH"].split(":")[0] == "/opt/mldist-host"
    assert "mldist: the container has no mldist: binding" in job.stdout
    # A second attempt in the same job directory (a requeue) reuses the image.
    again = make_job(tmp_path, standin_bin, **kw)
    again.log.unlink()
    assert again.run() == 0, again.explain()
    assert [a for a in again.argvs("apptainer") if a[0] == "pull"] == []
    assert "PYTHONPATH" not in again.calls("argv-recorder")[0]["env"], "an image with mldist keeps its own"


def test_container_uri_with_shell_syntax_is_refused() -> None:
    with pytest.raises(ConfigError, match="--container 'docker://x;id' is refused"):
        JobSpec(command=("x",), container="docker://x;id")


# -- launch lines -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_thetagpu_open_mpi_line_forwards_what_the_ranks_need(tmp_path: Path, standin_bin: Path) -> None:
    """Cobalt + --launcher openmpi + GPUs: mpirun with ppr:8:node, the node file, and -x for every variable."""
    nodefile = tmp_path / "nodes"
    nodefile.write_text("thetagpu01\nthetagpu02\n")
    kw = dict(
        output_dir=out_dir(tmp_path),
        launcher="openmpi",
        nodes=2,
        gpus_per_node=8,
        cores_per_node=128,
        env=(("MY_A", "one $$"), ("NCCL_DEBUG", "INFO")),
    )
    job = make_job(tmp_path, standin_bin, "cobalt", job_env={"COBALT_NODEFILE": str(nodefile)}, **kw)
    assert "#COBALT -n 2" in job.text and "aprun" not in job.text
    job.run()
    (launch,) = rank_launches(job)
    head = launch[: launch.index("bash")]
    assert head[:8] == ["-np", "16", "--map-by", "ppr:8:node:PE=16", "--bind-to", "core", "--hostfile", str(nodefile)]
    forwarded = head[9::2]
    assert {"PATH", "MLDIST_JOB_DIR", "OMP_NUM_THREADS", "MY_A", "NCCL_DEBUG", "MLDIST_REQUEUE_MARK"} <= set(forwarded)
    tasks = job.calls("argv-recorder")
    assert sorted(int(t["env"]["OMPI_COMM_WORLD_RANK"]) for t in tasks) == list(range(16))
    for t in tasks:  # the stand-in mpirun passes on only what -x names, as Open MPI does
        assert t["env"]["MY_A"] == "one $" and t["env"]["OMP_NUM_THREADS"] == "16"
        assert t["env"]["MLDIST_JOB_DIR"] == out_dir(tmp_path)
    assert sorted(p.name for p in job.jobdir.glob("rank-*.log")) == sorted(f"rank-{r}.log" for r in range(16))
    assert job.returncode == 0, job.explain()


@pytest.mark.slow
def test_hydra_line_on_pbs_uses_the_node_file(tmp_path: Path, standin_bin: Path) -> None:
    nodefile = tmp_path / "pbs nodes"
    nodefile.write_text("n1\nn2\n")
    job = make_job(
        tmp_path,
        standin_bin,
        "pbs",
        job_env={"PBS_NODEFILE": str(nodefile)},
        output_dir=out_dir(tmp_path),
        launcher="hydra",
        nodes=2,
        tasks_per_node=2,
        cpus_per_task=3,
    )
    job.run()
    check_job_ran(job, ["-n", "4", "-ppn", "2", "-f", str(nodefile)], [])
    assert sorted(t["env"]["MPI_LOCALRANKID"] for t in job.calls("argv-recorder")) == ["0", "0", "1", "1"]


# -- the save timer starts first --------------------------------------------------------------------


@pytest.mark.parametrize("scheduler", ["pbs", "cobalt"])
def test_save_timer_is_armed_before_modules_and_the_record(scheduler: str) -> None:
    spec = JobSpec(
        command=("python",), scheduler=scheduler, requeue=True, time="1:00:00", modules=("m",), env_source=("/s",)
    )
    lines = render(spec).split("\n")
    timer = next(i for i, line in enumerate(lines) if "kill -USR1 $$" in line)
    assert timer < lines.index("module load m") < next(i for i, line in enumerate(lines) if line.startswith("{"))
    assert lines.index("trap 'mldist_early_usr1=1' USR1") < timer


@pytest.mark.slow
def test_save_signal_before_the_ranks_start_requeues_without_running(tmp_path: Path, standin_bin: Path) -> None:
    """A grace period longer than the time left: the timer fires during setup; nothing ran, so resubmit."""
    slow = tmp_path / "slow.sh"
    slow.write_text("sleep 2\n")  # a slow module environment
    job = make_job(
        tmp_path,
        standin_bin,
        "pbs",
        output_dir=out_dir(tmp_path),
        requeue=True,
        time="1",
        grace=59,
        env_source=(str(slow),),
    )
    assert job.run(timeout=30) == 75, job.explain()
    assert "USR1 came before the workers started" in job.stdout
    assert rank_launches(job) == [] and len(job.calls("qsub")) == 1


@pytest.mark.slow
def test_a_rank_whose_program_is_missing_fails_the_job(tmp_path: Path, standin_bin: Path) -> None:
    """Exit 127 (command not found, e.g. python missing in a container) is the rank's status, not a success."""
    job = make_job(tmp_path, standin_bin, output_dir=out_dir(tmp_path), command=("no-such-program-mldist",))
    assert job.run() == 127, job.explain()
    assert job.stdout.splitlines()[-1] == "mldist: job step ended with exit code 127"
