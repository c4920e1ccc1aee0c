"""The hierarchical all-reduce (issue 65): when it is on, and that it gives the flat path's results.

The decision is pure (placement.hierarchy); the runs are real: ``mldist run -n 2`` on this host (one
node: flat), and 2 test hosts (scripts/test-hosts.sh) with 2 ranks each (in tiers) or 1 (flat).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from helpers import PY, ROOT, WORKERS, check, clean_env, mldist, results, start_service, stop_service, tail
from mldist.errors import ConfigError
from mldist.placement import Placement
from mldist.placement.hierarchy import requested, shape, tiers

SCRIPT = ROOT / "scripts" / "test-hosts.sh"
TIERS = [PY, str(WORKERS / "tiers.py")]
RAILS = [PY, str(WORKERS / "rails.py")]
#: What every rank's all-reduces give on 4 ranks (tiers.py: rank r adds r + 1, max of r).
SUMS_OF_4 = {"float32": 10.0, "bfloat16": 10.0, "int32": 10, "max": 3.0}


@pytest.mark.parametrize(
    ("setting", "nodes", "per_node", "on"),
    [
        ("auto", 2, 2, False),  # in a row, a power of two per node: Open MPI's all-reduce halves on the node first
        ("auto", 2, 3, True),  # 3 per node: its folding step would cross the link with halves
        ("auto", 4, 6, True),
        ("on", 4, 8, True),
        ("auto", 1, 4, False),  # one node
        ("on", 1, 4, False),
        ("auto", 8, 1, False),  # one rank per node
        ("off", 2, 2, False),
    ],
)
def test_tiers_only_over_several_nodes_with_more_than_one_rank_on_one(
    setting: str, nodes: int, per_node: int, on: bool
) -> None:
    assert tiers(setting, nodes, per_node).on is on


def test_the_switch_mldist_first_then_horovods() -> None:
    assert requested({}) == "auto"
    assert requested({"MLDIST_HIERARCHICAL": "0"}) == "off"
    assert requested({"MLDIST_HIERARCHICAL": "yes"}) == "on"
    assert requested({"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}) == "off"
    assert requested({"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "MLDIST_HIERARCHICAL": "0"}) == "off"
    with pytest.raises(ConfigError, match=r"^MLDIST_HIERARCHICAL='maybe' is not auto, 1 or 0: set auto"):
        requested({"MLDIST_HIERARCHICAL": "maybe"})
    with pytest.raises(ConfigError, match=r"^HOROVOD_HIERARCHICAL_ALLREDUCE='2' is not 1 or 0"):
        requested({"HOROVOD_HIERARCHICAL_ALLREDUCE": "2"})


def test_auto_takes_the_tiers_where_ranks_go_round_robin_over_the_nodes_not_where_nodes_differ() -> None:
    assert tiers("auto", 2, 2, in_a_row=False).on
    assert not tiers("auto", 2, 3, even=False).on
    assert tiers("on", 2, 3, even=False).on


def test_even_nodes_share_the_work_between_nodes_uneven_ones_go_through_one_leader() -> None:
    assert tiers("on", 2, 4).reason == (
        "2 nodes x 4 ranks: reduce-scatter on the node, 4 all-reduces across nodes, allgather"
    )
    assert tiers("on", 2, 3, even=False).reason.endswith("all-reduce among 2 node leaders, broadcast")


@pytest.mark.slow
def test_the_rails_reduce_scatter_all_reduce_and_allgather_give_the_sums() -> None:
    # Four real ranks on this host split by hand into 2 "nodes" of 2: every count, op and dtype exact.
    res = check(mldist(["run", "-n", "4", "--no-run-dir", "--", *RAILS], env=clean_env(), timeout=240))
    rows = _ranks(res)
    assert len(rows) == 4, tail(res)
    assert all(e == [0.0, 0.0, 0.0] for row in rows for e in row["errors"].values()), rows


def test_the_placements_shape() -> None:
    assert shape(Placement("openmpi", size=8, local_size=4)) == (2, 4)
    assert shape(Placement("slurm", size=4, local_size=1, hosts=("a", "b", "c", "d"))) == (4, 1)


def test_mldist_run_refuses_a_bad_switch_in_one_line(tmp_path: Path) -> None:
    res = mldist(["run", "-n", "2", "--", PY, "-c", "pass"], env=clean_env(MLDIST_HIERARCHICAL="sometimes"), timeout=60)
    assert res.returncode == 2, tail(res)
    assert "MLDIST_HIERARCHICAL='sometimes' is not auto, 1 or 0" in res.stderr, tail(res)
    assert "Traceback" not in res.stderr, tail(res)


def _ranks(res: object) -> list[dict[str, object]]:
    rows = sorted(results(res.stdout), key=lambda r: r["rank"])  # type: ignore[attr-defined]
    return rows


@pytest.mark.slow
def test_one_node_takes_the_flat_path() -> None:
    res = check(mldist(["run", "-n", "2", "--no-run-dir", "--", *TIERS], env=clean_env(), timeout=240))
    rows = _ranks(res)
    assert [(r["tiered"], r["hierarchy"]["on"], r["hierarchy"]["nodes"]) for r in rows] == [(False, False, 1)] * 2
    assert rows[0]["hierarchy"]["reason"] == "one node: the flat all-reduce never leaves it"
    assert rows[0]["sums"] == {"float32": 3.0, "bfloat16": 3.0, "int32": 3, "max": 1.0}
    assert rows[0]["weights"] == rows[1]["weights"]


@pytest.fixture(scope="module")
def hosts_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """An environment whose mpiexec reaches the test hosts hx1 and hx2 over ssh."""
    config = start_service(SCRIPT, "network namespaces, a bridge, sshd", "MLDIST_TEST_SSH_CONFIG")
    runs = tmp_path_factory.mktemp("runs")
    yield clean_env(PRTE_MCA_plm_ssh_agent=f"ssh -F {config}", MLDIST_RUNS_DIR=str(runs))
    stop_service(SCRIPT)


def _tiers_on(hosts: str, env: dict[str, str]) -> list[dict[str, object]]:
    res = check(mldist(["run", "-H", hosts, "--no-run-dir", "--", *TIERS], env=env, timeout=300))
    return _ranks(res)


@pytest.mark.slow
def test_two_hosts_of_two_ranks_reduce_in_tiers_to_the_flat_paths_weights(hosts_env: dict[str, str]) -> None:
    # Horovod's switch turns it on (mldist run -H forwards it to every host); unset, auto stays flat.
    tiers = _tiers_on("hx1:2,hx2:2", hosts_env | {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"})
    flat = _tiers_on("hx1:2,hx2:2", hosts_env)
    assert [r["node"] for r in tiers] == ["hx1", "hx1", "hx2", "hx2"], tiers
    assert [(r["tiered"], r["rails"], r["hierarchy"]["per_node"]) for r in tiers] == [(True, True, 2)] * 4
    assert [r["tiered"] for r in flat] == [False] * 4
    assert flat[0]["hierarchy"]["reason"].startswith("auto: 2 nodes x 2 ranks in a row: flat halves on the node")
    assert all(r["sums"] == SUMS_OF_4 for r in tiers + flat), [r["sums"] for r in tiers + flat]
    for t, f in zip(tiers, flat, strict=True):  # every rank: the same weights after the same steps
        for wt, wf in zip(t["weights"], f["weights"], strict=True):  # type: ignore[call-overload]
            np.testing.assert_allclose(np.array(wt, np.float32), np.array(wf, np.float32), rtol=1e-5, atol=1e-6)
    assert all(r["weights"] == tiers[0]["weights"] for r in tiers)


@pytest.mark.slow
def test_uneven_hosts_go_through_one_leader_to_the_flat_paths_weights(hosts_env: dict[str, str]) -> None:
    tiers = _tiers_on("hx1:2,hx2:1", hosts_env | {"MLDIST_HIERARCHICAL": "1"})
    flat = _tiers_on("hx1:2,hx2:1", hosts_env | {"MLDIST_HIERARCHICAL": "0"})
    assert [(r["tiered"], r["rails"]) for r in tiers] == [(True, False)] * 3, tiers
    assert tiers[0]["hierarchy"]["reason"].endswith("all-reduce among 2 node leaders, broadcast")
    assert [r["tiered"] for r in flat] == [False] * 3
    sums = {"float32": 6.0, "bfloat16": 6.0, "int32": 6, "max": 2.0}
    assert all(r["sums"] == sums for r in tiers + flat), [r["sums"] for r in tiers + flat]
    for t, f in zip(tiers, flat, strict=True):
        for wt, wf in zip(t["weights"], f["weights"], strict=True):  # type: ignore[call-overload]
            np.testing.assert_allclose(np.array(wt, np.float32), np.array(wf, np.float32), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_one_rank_per_host_takes_the_flat_path(hosts_env: dict[str, str]) -> None:
    rows = _tiers_on("hx1:1,hx2:1", hosts_env)
    assert [(r["tiered"], r["hierarchy"]["nodes"], r["hierarchy"]["per_node"]) for r in rows] == [(False, 2, 1)] * 2
    assert rows[0]["hierarchy"]["reason"].startswith("one rank per node")
    assert rows[0]["sums"] == {"float32": 3.0, "bfloat16": 3.0, "int32": 3, "max": 1.0}


@pytest.mark.slow
def test_mldist_env_says_which_all_reduce(hosts_env: dict[str, str]) -> None:
    cmd = ["run", "-H", "hx1:2,hx2:2", "--no-run-dir", "--", PY, "-m", "mldist", "env"]
    res = check(mldist(cmd, env=hosts_env | {"MLDIST_HIERARCHICAL": "1"}, timeout=180))
    said = [line.split("] ", 1)[1] for line in res.stdout.splitlines() if "allreduce " in line]
    expected = (
        "allreduce hierarchical (2 nodes x 2 ranks: reduce-scatter on the node, 2 all-reduces across nodes, allgather)"
    )
    assert said == [expected] * 4, tail(res)
    res = check(mldist(cmd, env=hosts_env, timeout=180))
    assert res.stdout.count("allreduce flat (auto: 2 nodes x 2 ranks in a row: flat halves on the node") == 4, tail(res)
    # 3 ranks per host: auto goes in tiers (Open MPI's flat all-reduce would fold across the link).
    cmd[2] = "hx1:3,hx2:3"
    res = check(mldist(cmd, env=hosts_env, timeout=240))
    said = (
        "allreduce hierarchical (2 nodes x 3 ranks: reduce-scatter on the node, 3 all-reduces across nodes, allgather)"
    )
    assert res.stdout.count(said) == 6, tail(res)
