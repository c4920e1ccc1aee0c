"""The command line as a user meets it: ``--help`` of every command, and bad input.

Bad input gets one clear line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import subprocess

import pytest

from helpers import PY, check, clean_env, mldist
from mldist.cli import build_parser
from mldist.launch.batch.spec import JobSpec
from mldist.placement.resources import cpu_probe


def _commands() -> list[str]:
    """Every subcommand registered on the real parser: a new command is tested without editing this file."""
    parser, _handlers = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


COMMANDS = _commands()


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess[str]]:
    """``python -m mldist CMD --help`` for every command, started together rather than one after another."""
    env = clean_env()
    procs = {
        cmd: subprocess.Popen(
            [PY, "-m", "mldist", cmd, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for cmd in COMMANDS
    }
    done = {}
    try:
        for cmd, proc in procs.items():
            out, err = proc.communicate(timeout=60)
            done[cmd] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done


def test_the_walk_finds_the_commands() -> None:
    assert {"run", "env", "submit", "status", "cancel", "logs"} <= set(COMMANDS), COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(
    command: str, helps: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    res = check(helps[command])
    assert "example:" in res.stdout
    assert f"mldist {command}" in res.stdout


def test_grace_means_the_same_in_run_and_submit_and_its_help_tells_the_real_default() -> None:
    parser, _handlers = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run, submit = (next(a for a in sub.choices[c]._actions if "--grace" in a.option_strings) for c in ("run", "submit"))
    same = "seconds the workers get to save and exit"
    assert same in run.help and "after SIGINT/SIGTERM" in run.help and f"(default {run.default:g};" in run.help
    assert same in submit.help and "before the time limit" in submit.help and "(SIGUSR1)" in submit.help
    assert submit.default is None and f"(default {JobSpec(command=('t',)).grace})" in submit.help  # the spec's
    assert "same meaning as mldist run's --grace" in submit.help and "submit's --grace is the same time" in run.help


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["run", "-n", "0", "--", "true"], "0 is not at least 1"),
        (["run", "-n", "two", "--", "true"], "'two' is not a whole number"),
        (["run", "-n", "2"], "missing COMMAND"),
        (["run", "-n", "2", "--"], "missing COMMAND"),
        (["run", "--bogus", "-n", "2", "true"], "unrecognized arguments: --bogus"),
        (["run", "-n", "2", "--grace", "-1", "true"], "is negative"),
        (["run", "-n", "2", "--", "/nonexistent/prog"], "cannot start '/nonexistent/prog'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "required: COMMAND"),
        # Formerly its own test (test_negative_max_restarts_is_one_line_exit_2); last, to keep the ids above.
        (["run", "-n", "2", "--max-restarts", "-1", "--", "true"], "--max-restarts"),
        # horovodrun's flags: -H on this host agrees with -np; other hosts need the MPI engine; one engine flag.
        (["run", "--", "true"], "say how many workers"),
        (["run", "-H", "localhost:2\n", "--", "true"], "write host:slots"),
        (["run", "-np", "3", "-H", "localhost:2", "--", "true"], "-np 3 but -H gives 2 slots on this host"),
        (["run", "-np", "5", "-H", "node7:2,node8:2", "--", "true"], "-n 5 is more than the 4 slots of -H"),
        (["run", "-n", "2", "--network-interface", "ib0", "--", "true"], "with -H or --hostfile"),
        (["run", "--hostfile", "/nonexistent/hosts", "--", "true"], "--hostfile '/nonexistent/hosts'"),
        (["run", "-H", "node7:2", "--log-dir", "logs", "--", "true"], "--log-dir and --cpu-bind are for one host"),
        (["run", "-np", "2", "--gloo", "--mpi", "--", "true"], "not allowed with argument --gloo"),
        # Elastic worlds: hosts to lose, -n within the bounds, no fixed-world restarts, no joining hosts yet.
        (["run", "-n", "2", "--min-np", "1", "--", "true"], "an elastic world needs other hosts"),
        (["run", "-H", "n7:1,n8:1", "--min-np", "3", "--max-np", "4", "--", "true"], "give --min-np 3 <= -n <="),
        (["run", "-H", "n7:1,n8:1", "--min-np", "2", "--max-np", "1", "--", "true"], "give 1 <= --min-np <= --max"),
        (["run", "-H", "n7:1,n8:1", "--min-np", "1", "--max-restarts", "1", "--", "true"], "--reset-limit bounds"),
        (["run", "-H", "n7:1,n8:1", "--min-np", "1", "--elastic-timeout", "x", "--", "true"], "not a number"),
        (["run", "-H", "n7:1,n8:1", "--host-discovery-script", "/nonexistent", "--", "true"], "not an executable"),
        (["run", "--host-discovery-script", "/bin/false", "--", "true"], "'/bin/false' exited with 1"),
        (["run", "-H", "n7:1", "--host-discovery-script", "/bin/true", "--no-run-dir", "--", "true"], "--no-run-dir"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], fragment: str) -> None:
    res = check(mldist(args), 2)
    lines = res.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, res.stderr
    assert fragment in lines[-1]
    assert "Traceback" not in res.stderr


def test_bad_environment_is_reported_not_raised() -> None:
    res = mldist(["env", "--json", "--no-tensorflow"], env=clean_env(SLURM_STEP_ID="0", SLURM_PROCID="x"))
    check(res)
    assert "SLURM_PROCID='x' is not an integer" in res.stdout


def test_a_bad_engine_setting_is_shown_with_its_value() -> None:
    res = check(mldist(["env", "--no-tensorflow"], env=clean_env(MLDIST_COMMUNICATION="bogus")))
    (line,) = [line for line in res.stdout.splitlines() if line.startswith("engine ")]
    assert line.endswith("error (asked: bogus) - communication='bogus' is not one of auto, mpi, ring, nccl"), line


def test_env_lists_the_variables_of_the_stack_by_name_and_no_unknown_node() -> None:
    ours = {
        "XLA_FLAGS": "--xla_gpu_cuda_data_dir=/opt/cuda",
        "FI_CXI_DISABLE_HOST_REGISTER": "1",
        "OMPI_MCA_btl": "^openib",
        "HOROVOD_MPI_THREADS_DISABLE": "1",
        "KERAS_BACKEND": "tensorflow",
        "JAX_PLATFORMS": "cpu",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    terraform = {"TF_CLI_CONFIG_FILE": "/home/u/.terraformrc", "TF_VAR_region": "eu", "TF_LOG": "DEBUG"}
    tests_own = (
        "MLDIST_RUNS_DIR",
        "MLDIST_PLOT",
        "JAX_COMPILATION_CACHE_DIR",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
        "MLDIST_TESTS_LEAN_GC",
    )
    # Only what the test sets: a machine may export any of the stack's variables itself
    # (TF_ENABLE_ONEDNN_OPTS, CUDA_*, OMPI_MCA_*), and importing TensorFlow earlier in this pytest
    # process may have set KMP_*.
    keep = {*ours, *terraform, *tests_own, "OMP_NUM_THREADS", "PATH", "HOME", "PYTHONPATH", "PRTE_MCA_prte_tmpdir_base"}
    env = {k: v for k, v in clean_env(**ours, **terraform, OMP_NUM_THREADS="1").items() if k in keep}
    res = check(mldist(["env", "--no-tensorflow"], env=env))
    listed = dict(line.split()[1].split("=", 1) for line in res.stdout.splitlines() if line.startswith("env "))
    # Terraform's TF_* are not TensorFlow's.
    assert listed == {**ours, "OMP_NUM_THREADS": "1", **{k: env[k] for k in tests_own}}
    assert "None" not in res.stdout and "launcher  none: rank 0 of 1, local 0 of 1\n" in res.stdout
    probe = cpu_probe()
    if not probe.pinned:  # a narrowed affinity mask wins over the variable
        assert "threads   1 cpus (OMP_NUM_THREADS): intra-op 1" in res.stdout
        assert ("note      OMP_NUM_THREADS=1 gives each rank 1 CPU" in res.stdout) == (probe.total > 1)


@pytest.mark.parametrize(
    "flags, engine",
    [(["-np", "2", "--gloo"], "ring"), (["-H", "localhost:1,127.0.0.1:1", "--mpi"], "mpi")],
    ids=["np-gloo", "hosts-mpi"],
)
def test_horovodrun_flags_start_the_workers(flags: list[str], engine: str) -> None:
    """``horovodrun -np 2 python train.py`` becomes ``mldist run -np 2 python train.py``."""
    show = "import os; print('RANK', os.environ['MLDIST_RANK'], os.environ['MLDIST_COMMUNICATION'])"
    res = check(mldist(["run", *flags, "--", PY, "-c", show], timeout=60))
    assert sorted(line.split(" ", 1)[1] for line in res.stdout.splitlines() if " RANK " in line) == [
        f"RANK 0 {engine}",
        f"RANK 1 {engine}",
    ]
