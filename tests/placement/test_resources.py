"""Thread, GPU and proxy plans."""

from __future__ import annotations

import pytest

from mldist.errors import ConfigError
from mldist.placement.proxies import proxy_settings
from mldist.placement.resources import choose_gpu, openmp_defaults, physical_gpu_id, plan_threads


@pytest.mark.parametrize(
    "affinity, total, cpt, local, cpus, source",
    [
        (8, 64, None, 8, 8, "affinity mask"),  # srun --cpu-bind / aprun -cc depth
        (64, 64, 16, 4, 16, "cpus per task"),  # --cpus-per-task without binding
        (64, 64, None, 4, 16, "64 cores / 4 ranks"),
        (2, 2, None, 4, 1, "2 cores / 4 ranks"),  # oversubscribed: never 0
    ],
)
def test_thread_plan(affinity: int, total: int, cpt: int | None, local: int, cpus: int, source: str) -> None:
    plan = plan_threads(affinity, total, cpt, local)
    assert (plan.cpus, plan.intra_op, plan.source) == (cpus, cpus, source)
    assert plan.inter_op == (2 if cpus >= 4 else 1)


def test_kmp_affinity_only_when_pinned() -> None:
    plan = plan_threads(4, 8, None, 2)
    assert openmp_defaults(plan, pinned=True)["KMP_AFFINITY"].startswith("granularity=fine")
    assert "KMP_AFFINITY" not in openmp_defaults(plan, pinned=False)


def test_gpu_choice() -> None:
    assert choose_gpu(4, 3, 4) == 3  # one of four GPUs per rank
    assert choose_gpu(1, 3, 4) == 0  # launcher already narrowed CUDA_VISIBLE_DEVICES
    assert choose_gpu(0, 1, 2) is None  # CPU node
    with pytest.raises(ConfigError, match="local rank 2 has no GPU: 2 are visible"):
        choose_gpu(2, 2, 4)
    # Reversed site order (Perlmutter, Polaris): rank 0 takes the first listed.
    assert physical_gpu_id(choose_gpu(4, 0, 4) or 0, "3,2,1,0") == "3"


def test_proxy_keeps_workers_direct() -> None:
    env = {"https_proxy": "http://proxy:3128", "no_proxy": "example.org"}
    out = proxy_settings(env, ["nid001", "nid002"])
    assert out["no_proxy"] == "example.org,localhost,127.0.0.1,nid001,nid002"
    assert out["NO_PROXY"] == out["no_proxy"]
    assert proxy_settings({}, ["nid001"]) == {}


@pytest.mark.parametrize("cpus", [1, 2, 4])
def test_every_rank_of_a_group_across_nodes_gets_two_inter_op_threads(cpus: int) -> None:
    # With one, TensorFlow ran backprop's ops inline to the end before any collective's start op it
    # had queued: no bucket's all-reduce overlapped backprop (issue 49). On one node it stays as it was.
    assert plan_threads(cpus, 8, None, 1, size=2).inter_op == 2
    assert plan_threads(cpus, 8, None, 2, size=2).inter_op == (2 if cpus >= 4 else 1)
    assert plan_threads(cpus, 8, None, 1).inter_op == (2 if cpus >= 4 else 1)
