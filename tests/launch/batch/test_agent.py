"""The elastic Slurm agent against stand-in ``srun``/``scontrol`` (the real cluster: tests/slurm).

The stand-in srun runs a step's command only when its node list has no lost node; with one, it
says that a task failed, as srun does, and waits for the lost node forever. Probes (``... true``)
fail on lost nodes.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from helpers import PY, clean_env
from mldist.launch.batch.agent import PROBE_TIMEOUT

SRUN = """#!/bin/bash
echo "$*" >> "$LOG"
nodes=""; for a in "$@"; do case "$a" in --nodelist=*) nodes="${a#--nodelist=}" ;; esac; done
for n in ${nodes//,/ }; do
  if [[ " $LOST " == *" $n "* ]]; then
    [ "${@: -1}" = true ] && { [ -n "$HANG" ] && exec sleep 600; exit 1; }  # a dead slurmd, or one Slurm knows
    echo "srun: error: node1: task 0: Exited with exit code 1" >&2
    exec sleep 600
  fi
done
[ "${@: -1}" = true ] && exit 0
exec "${@: -3}"
"""
SCONTROL = '#!/bin/bash\n[ "$1 $2" = "show hostnames" ] && echo node1 node2 node3\n'
#: The job's steps, and scancel recording what it was asked to cancel (never the machine's real Slurm).
SQUEUE = '#!/bin/bash\nprintf "7.0\\n7.batch\\n7.extern\\n"\n'
SCANCEL = '#!/bin/bash\necho "scancel $*" >> "$LOG"\n'


def _agent(
    tmp_path: Path, lost: str, *args: str, srun: str = SRUN, hang: bool = False
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", srun), ("scontrol", SCONTROL), ("squeue", SQUEUE), ("scancel", SCANCEL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "srun.log"
    env = clean_env(PATH=f"{bin_dir}:/usr/bin:/bin", LOG=str(log), LOST=lost, SLURM_JOB_NODELIST="node[1-3]",
                    SLURM_JOB_ID="7", MLDIST_RUN_DIR=str(tmp_path / "run"), HANG="1" if hang else "")  # fmt: skip
    argv = [PY, "-m", "mldist.launch.batch.agent", *args, "--", "srun", "--nodes=3", "--ntasks=3", "sh", "-c", "exit 0"]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    steps = [line for line in log.read_text().splitlines() if "--mpi=none" not in line and "scancel" not in line]
    return res, steps


def test_a_lost_node_re_forms_the_world_on_the_rest(tmp_path: Path) -> None:
    started = time.monotonic()
    res, steps = _agent(tmp_path, "node3", "--min-nodes", "2", "--tasks-per-node", "2", hang=True)
    assert res.returncode == 0, res.stdout + res.stderr
    # node3's probe hangs; the others answer at once: it is lost after PROBE_GRACE, not PROBE_TIMEOUT.
    assert time.monotonic() - started < PROBE_TIMEOUT, res.stdout
    assert steps[0].startswith("--nodes=3 --ntasks=6 --nodelist=node1,node2,node3 "), steps
    assert steps[1].startswith("--nodes=2 --ntasks=4 --nodelist=node1,node2 --overlap "), steps
    assert "scancel --quiet 7.0" in (tmp_path / "srun.log").read_text()  # the lost step, through the controller
    assert len(steps) == 2, steps
    assert (
        "mldist: lost node node3 (it does not answer); re-forming the world on node1,node2: 4 worker(s)" in res.stdout
    )
    assert (tmp_path / "run" / "elastic.json").stat().st_mode & 0o077 == 0
    # The one re-forming record (mldist.launch.elastic.supervisor.Reform), as -H runs' summary.json has it.
    (kept,) = json.loads((tmp_path / "run" / "elastic.json").read_text())["reforms"]
    assert (kept["lost"], kept["why"], kept["before"], kept["after"]) == (["node3"], "it does not answer", 6, 4)
    assert 0 < kept["hosts_checked_s"] <= kept["restart_s"] < PROBE_TIMEOUT, kept


@pytest.mark.parametrize(("requeue", "code"), [((), 1), (("--requeue",), 75)])
def test_below_the_minimum_the_job_ends_or_is_requeued(tmp_path: Path, requeue: tuple[str, ...], code: int) -> None:
    res, steps = _agent(tmp_path, "node2 node3", "--min-nodes", "2", "--tasks-per-node", "1", *requeue)
    assert res.returncode == code, res.stdout + res.stderr
    assert len(steps) == 1, steps
    then = "requeueing the job (--requeue)" if requeue else "ending the job"
    assert f"lost node node2, node3 (it does not answer); 1 node(s) left, below --min-nodes 2: {then}" in res.stdout
    # The failed job's commits leave the memory of the node left (the workers remove theirs after a whole run).
    (cleanup,) = [line for line in (tmp_path / "srun.log").read_text().splitlines() if "rm -rf" in line]
    assert '--nodelist=node1 sh -c rm -rf -- /dev/shm/mldist-"$(id -u)"/' in cleanup, cleanup


def test_a_failure_with_every_node_answering_ends_the_job_with_its_code(tmp_path: Path) -> None:
    res, steps = _agent(tmp_path, "", "--min-nodes", "2", "--tasks-per-node", "1")
    assert res.returncode == 0 and len(steps) == 1, res.stdout + res.stderr
    fails = SRUN.replace('exec "${@: -3}"', "echo 'srun: error: node2: task 1: Exited with exit code 3' >&2; exit 3")
    res, steps = _agent(tmp_path, "", "--min-nodes", "2", "--tasks-per-node", "1", srun=fails)
    assert res.returncode == 3 and "lost node" not in res.stdout, res.stdout + res.stderr
    assert "node2: task 1: Exited with exit code 3" in res.stderr  # srun's lines pass through
