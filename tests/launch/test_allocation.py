"""`mldist run` inside a PBS job: Open MPI's mpiexec with the job's node file (a stand-in mpiexec).

The stand-in (``MLDIST_MPIEXEC``) records its argv and starts the ranks' shims on this host with
Open MPI's rank variables; the real Slurm cluster's test is tests/slurm/test_slurm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import PY, clean_env, mldist
from mldist.placement.allocation import Allocation, allocation

MPIEXEC = f"""#!{PY}
import json, os, subprocess, sys
argv = sys.argv[1:]
if argv == ["--version"]:
    print("mpiexec (Open MPI) 5.0.3")
    sys.exit(0)
with open(os.environ["STANDIN_LOG"], "a") as f:
    f.write(json.dumps(argv) + "\\n")
n = int(argv[argv.index("-n") + 1])
cmd = argv[argv.index("mldist.launch.remote_shim") - 2 :]
ranks = {{"OMPI_COMM_WORLD_SIZE": str(n), "OMPI_COMM_WORLD_LOCAL_SIZE": str(n)}}
procs = [subprocess.Popen(cmd, env={{**os.environ, **ranks, "OMPI_COMM_WORLD_RANK": str(r),
                                     "OMPI_COMM_WORLD_LOCAL_RANK": str(r)}}) for r in range(n)]
sys.exit(max(p.wait() for p in procs))
"""


@pytest.fixture
def pbs_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "nodefile").write_text("x1001\nx1001\nx1002\nx1002\n")
    fake = tmp_path / "mpiexec"
    fake.write_text(MPIEXEC)
    fake.chmod(0o755)
    return clean_env(PBS_JOBID="7.pbs", PBS_NODEFILE=str(tmp_path / "nodefile"), MLDIST_MPIEXEC=str(fake),
                     STANDIN_LOG=str(tmp_path / "argv.jsonl"))  # fmt: skip


def test_inside_a_pbs_job_mpiexec_starts_the_ranks_with_the_node_file(pbs_env: dict[str, str], tmp_path: Path) -> None:
    res = mldist(["run", "--no-run-dir", "--", PY, "-c", "import os; print('HELLO', os.environ['RANK'])"],
                 env=pbs_env, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    (argv,) = [json.loads(line) for line in (tmp_path / "argv.jsonl").read_text().splitlines()]
    assert argv[argv.index("-n") + 1] == "4", argv  # -n: the node file's slots
    assert argv[argv.index("--hostfile") + 1] == str(tmp_path / "nodefile") and "--host" not in argv, argv
    assert sorted(line for line in res.stdout.splitlines() if "HELLO" in line) == [f"[{r}] HELLO {r}" for r in range(4)]
    assert "inside PBS job 7.pbs: 4 worker(s) over the node file" in res.stderr, res.stderr


def test_more_workers_than_the_allocation_holds_is_one_line(pbs_env: dict[str, str], tmp_path: Path) -> None:
    res = mldist(["run", "-n", "5", "--no-run-dir", "--", "true"], env=pbs_env, timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "-n 5 is more than the 4 task(s) of pbs job 7.pbs (2 node(s)); give -n 4 or less, or --local" in res.stderr
    assert not (tmp_path / "argv.jsonl").exists()


@pytest.mark.parametrize(
    ("env", "found"),
    [
        ({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-2]"}, Allocation("slurm", "9", ("n1", "n2"))),
        ({"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n1"}, None),  # a task of a step
        ({"SLURM_JOB_ID": "9", "PBS_JOBID": "9", "SLURM_NODELIST": "n1", "SLURM_NTASKS": "2"},
         Allocation("slurm", "9", ("n1",), 2)),  # Slurm's PBS_* compatibility variables
        ({"PBS_JOBID": "7.pbs"}, None),  # no node file: not a PBS job's shell
        ({}, None),
    ],
)  # fmt: skip
def test_the_allocation_is_read_from_the_scheduler_s_variables(env: dict[str, str], found: Allocation | None) -> None:
    assert allocation(env) == found
