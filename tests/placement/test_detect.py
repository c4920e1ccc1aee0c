"""Environment detection: captured launcher environments and edge cases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers import TESTS
from mldist.errors import DetectionError
from mldist.placement.detect import detect, slurm_rank_nodes

FIXTURES = sorted((TESTS / "fixtures" / "envs").glob("*.json"))


def _cases() -> list[tuple[str, int, dict[str, Any], dict[str, Any]]]:
    cases = []
    for path in FIXTURES:
        data = json.loads(path.read_text())
        for i, task in enumerate(data["tasks"]):
            cases.append((path.stem, i, data, task))
    return cases


def test_fixtures_cover_every_launcher() -> None:
    launchers = {json.loads(p.read_text())["launcher"] for p in FIXTURES}
    assert {"slurm", "openmpi", "mpich", "pals", "aprun", "pbs"} <= launchers


@pytest.mark.parametrize("name, index, data, task", _cases(), ids=lambda v: v if isinstance(v, str | int) else "")
def test_captured_environment(
    name: str, index: int, data: dict[str, Any], task: dict[str, Any], tmp_path: Path
) -> None:
    env = dict(task["env"])
    for fname, content in data.get("files", {}).items():
        local = tmp_path / Path(fname).name
        local.write_text(content)
        env = {k: (str(local) if v == fname else v) for k, v in env.items()}
    want = task["expect"]
    if want["size"] is None:  # aprun exports no world size: mldist must say what to set
        with pytest.raises(DetectionError, match="MLDIST_SIZE"):
            detect(env)
        return
    p = detect(env)
    got = {"rank": p.rank, "size": p.size, "local_size": p.local_size}
    assert got == {k: want[k] for k in got}, data["source"]
    if want.get("node_index") is not None and p.node_index is not None:
        assert p.node_index == want["node_index"]
    if want.get("hosts") and p.hosts is not None:
        assert list(p.hosts) == want["hosts"]


# aprun's fixture has no layout to compare: its variables cannot give one.
_LAYOUTS = [p for p in FIXTURES if json.loads(p.read_text())["tasks"][0]["expect"]["size"] is not None]


@pytest.mark.parametrize("path", _LAYOUTS, ids=lambda p: p.stem)
def test_local_ranks_are_a_permutation_per_node(path: Path) -> None:
    # Open MPI may number local ranks 0,2,1 (oversubscribed); any one-to-one layout is right.
    data = json.loads(path.read_text())
    got: dict[int, list[int]] = {}
    want: dict[int, list[int]] = {}
    for task in data["tasks"]:
        env = {k: v for k, v in task["env"].items() if k != "PBS_NODEFILE"}
        node = task["expect"]["node_index"] or 0
        got.setdefault(node, []).append(detect(env).local_rank)
        want.setdefault(node, []).append(task["expect"]["local_rank"])
    assert {n: sorted(v) for n, v in got.items()} == {n: sorted(v) for n, v in want.items()}


def test_aprun_with_the_sizes_mldist_submit_exports() -> None:
    env = {"ALPS_APP_PE": "3", "ALPS_APP_ID": "99", "MLDIST_SIZE": "4", "MLDIST_LOCAL_SIZE": "2"}
    p = detect(env)
    assert (p.launcher, p.rank, p.size, p.local_rank, p.local_size, p.node_index) == ("aprun", 3, 4, 1, 2, 1)


def _slurm(rank: int, node: int, local: int, ntasks: int, nodes: str, tpn: str, **extra: str) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NODEID": str(node),
        "SLURM_LOCALID": str(local),
        "SLURM_STEP_NODELIST": nodes,
        "SLURM_STEP_TASKS_PER_NODE": tpn,
        **extra,
    }


def test_slurm_uneven_tasks_per_node_block() -> None:
    # 8 tasks over gpu[01-03]: 3,3,2 -> rank 7 is the 2nd task on gpu03.
    p = detect(_slurm(7, 2, 1, 8, "gpu[01-03]", "3(x2),2"))
    assert (p.rank, p.size, p.local_rank, p.local_size, p.node_index) == (7, 8, 1, 2, 2)
    assert p.hosts == ("gpu01", "gpu02", "gpu03")
    assert p.rank_nodes == (0, 0, 0, 1, 1, 1, 2, 2)
    assert p.job_key == "77.0"


def test_slurm_cyclic_distribution() -> None:
    p = detect(_slurm(1, 1, 0, 3, "n[1-2]", "2,1", SLURM_DISTRIBUTION="cyclic"))
    assert p.rank_nodes == (0, 1, 0)
    assert slurm_rank_nodes([2, 2], "cyclic:block") == (0, 1, 0, 1)


def test_slurm_layout_that_contradicts_nodeid_is_not_trusted() -> None:
    # An arbitrary distribution: rank 0 on node 1 cannot come from block layout.
    p = detect(_slurm(0, 1, 0, 2, "n[1-2]", "1(x2)", SLURM_DISTRIBUTION="arbitrary"))
    assert p.rank_nodes is None


def test_mpirun_inside_slurm_uses_the_mpi_ranks() -> None:
    env = _slurm(0, 0, 0, 2, "n[1-2]", "1(x2)")
    env.update(OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_RANK="0")
    env.update(OMPI_COMM_WORLD_LOCAL_SIZE="1")
    p = detect(env)
    assert (p.launcher, p.rank, p.size) == ("openmpi", 1, 2)


def test_sbatch_script_without_srun_is_one_process() -> None:
    env = {"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]"}
    assert detect(env).size == 1


def test_tf_config_given_by_the_user() -> None:
    cfg = {"cluster": {"worker": ["a:1", "b:1", "a:2"]}, "task": {"type": "worker", "index": 2}}
    p = detect({"TF_CONFIG": json.dumps(cfg)})
    assert (p.launcher, p.rank, p.size, p.local_rank, p.local_size) == ("tf_config", 2, 3, 1, 2)
    assert p.workers == ("a:1", "b:1", "a:2")


@pytest.mark.parametrize(
    "env, message",
    [
        ({"TF_CONFIG": "{not json"}, "TF_CONFIG="),
        ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"index": 3}})}, "not one of"),
        ({"PMI_RANK": "0"}, "world size is unknown: set PMI_SIZE"),
        ({"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "2"}, "rank 4 is outside a world of size 2"),
        ({"MLDIST_RANK": "0", "MLDIST_SIZE": "2", "MLDIST_WORKERS": "a:1"}, "1 worker addresses"),
    ],
)
def test_inconsistent_environments_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(DetectionError, match=message):
        detect(env)


def test_no_launcher() -> None:
    p = detect({"HOME": "/root"})
    assert (p.launcher, p.rank, p.size, p.local_rank, p.local_size) == ("none", 0, 1, 0, 1)


def test_aprun_without_a_size_names_the_one_variable_to_set() -> None:
    env = {"ALPS_APP_PE": "1", "ALPS_APP_ID": "99", "ALPS_APP_DEPTH": "2"}
    with pytest.raises(DetectionError) as err:
        detect(env)
    text = str(err.value)
    assert "aprun exports no world size; set MLDIST_SIZE" in text
    assert "-e MLDIST_SIZE=8" in text and "PMI_SIZE" not in text


def test_aprun_takes_cray_pmi_size_when_exported() -> None:
    p = detect({"ALPS_APP_PE": "1", "PMI_SIZE": "2"})
    assert (p.launcher, p.rank, p.size, p.local_size) == ("aprun", 1, 2, 1)


def test_missing_size_names_each_variable_once() -> None:
    with pytest.raises(DetectionError, match=r"set PMI_SIZE or MLDIST_SIZE$"):
        detect({"PMI_RANK": "0"})


def test_srun_with_its_pmi2_plugin_is_slurm_and_hydra_over_srun_is_not() -> None:
    slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2"}
    slurm |= {"SLURM_STEP_NODELIST": "node[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "1"}
    # srun --mpi=pmi2: PMI_RANK is srun's own rank; Slurm's rule knows the hosts.
    direct = detect({**slurm, "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "PMI_RANK": "1", "PMI_SIZE": "2"})
    assert (direct.launcher, direct.rank, direct.hosts) == ("slurm", 1, ("node1", "node2"))
    # Hydra's proxy started by srun (one per node) runs 4 ranks: the PMI rank is Hydra's.
    hydra = detect({**slurm, "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "PMI_RANK": "5", "PMI_SIZE": "8"})
    assert (hydra.launcher, hydra.rank, hydra.size) == ("mpich", 5, 8)


@pytest.mark.parametrize("path", _LAYOUTS, ids=lambda p: p.stem)
def test_the_start_up_hook_gives_keras_one_coordinator_and_each_rank_its_id(path: Path, tmp_path: Path) -> None:
    """What a batch job's ranks get from mldist's start-up hook, under every captured launcher: the
    same coordinator on every rank, its own process id, and (asked) TF_CONFIG naming it."""
    from mldist.runtime.start.startup import fill

    data = json.loads(path.read_text())
    seen = []
    for task in data["tasks"]:
        env = {**task["env"], "MLDIST_TF_CONFIG": "1"}
        for fname, content in data.get("files", {}).items():
            (tmp_path / Path(fname).name).write_text(content)
            env = {k: (str(tmp_path / Path(fname).name) if v == fname else v) for k, v in env.items()}
        rank = fill(env)
        if "KERAS_DISTRIBUTION_JOB_ADDRESSES" not in env:  # mpiexec without hosts: only asking would tell
            assert rank is None or data["launcher"] in ("openmpi", "mpich"), data["source"]
            continue
        assert env["KERAS_DISTRIBUTION_PROCESS_ID"] == str(rank) == env["RANK"]
        if "TF_CONFIG" in env:  # needs every rank's host: not where the launcher gives no layout (PALS)
            assert json.loads(env["TF_CONFIG"])["task"]["index"] == rank
        seen.append((env["KERAS_DISTRIBUTION_JOB_ADDRESSES"], env["KERAS_DISTRIBUTION_NUM_PROCESSES"]))
    assert len(set(seen)) <= 1, seen
