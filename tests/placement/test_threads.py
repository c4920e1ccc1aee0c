"""Thread pool sizes: the plan from the CPUs, and the user's overrides (argument > variable > plan)."""

from __future__ import annotations

import pytest

from mldist.errors import ConfigError
from mldist.placement.resources import CpuProbe, ThreadPlan, override_threads, thread_count, thread_plan

NODE8 = CpuProbe(8, tuple(range(8)))


def test_unbound_ranks_inside_a_cpu_set_share_it_and_pin_nothing() -> None:
    """``mldist run -n 4`` in an 8-CPU set of a 64-CPU node: 2 each, not 8 each (4x oversubscribed)."""
    job_set = CpuProbe(64, tuple(range(8)), shared=True)
    plan = thread_plan({}, 4, job_set)
    assert (plan.cpus, plan.source, job_set.pinned) == (2, "8 cores / 4 ranks", False)
    assert thread_plan({"MLDIST_CPUS_PER_TASK": "3"}, 4, job_set).cpus == 3  # the variable counts again
    own = CpuProbe(64, tuple(range(8)))  # srun/aprun bound this rank to its 8 CPUs
    assert (thread_plan({}, 4, own).cpus, thread_plan({}, 4, own).source, own.pinned) == (8, "affinity mask", True)


def test_without_a_cpus_per_task_variable_the_node_is_shared_among_local_ranks() -> None:
    plan = thread_plan({}, 4, NODE8)
    assert (plan.cpus, plan.intra_op, plan.inter_op, plan.source) == (2, 2, 1, "8 cores / 4 ranks")
    assert plan.overrides == ""


def test_an_exported_omp_num_threads_or_aprun_depth_is_the_rank_s_cpus() -> None:
    assert thread_plan({"OMP_NUM_THREADS": "3"}, 2, NODE8).cpus == 3  # what batch scripts will compute
    assert thread_plan({"ALPS_APP_DEPTH": "4", "OMP_NUM_THREADS": "1"}, 2, NODE8).cpus == 4


def test_the_plan_names_the_variable_that_sized_it_and_notes_an_inherited_low_omp_num_threads() -> None:
    plan = thread_plan({"OMP_NUM_THREADS": "1"}, 2, NODE8)
    assert (plan.cpus, plan.intra_op, plan.source) == (1, 1, "OMP_NUM_THREADS")  # not "(cpus per task)"
    assert plan.note.startswith("OMP_NUM_THREADS=1 gives each rank 1 CPU thread(s) of the 4 it could use")
    assert "unset OMP_NUM_THREADS" in plan.note and "\n" not in plan.note
    assert thread_plan({"OMP_NUM_THREADS": "1"}, 2, NODE8, intra_op=4).note == plan.note  # OpenMP still gets 1
    assert thread_plan({"OMP_NUM_THREADS": "4"}, 2, NODE8).note == ""  # the share itself: nothing lowered
    slurm = thread_plan({"SLURM_CPUS_PER_TASK": "2", "OMP_NUM_THREADS": "1"}, 2, NODE8)
    assert (slurm.cpus, slurm.source, slurm.note) == (2, "cpus per task", "")  # a job's request is not noted
    assert thread_plan({"ALPS_APP_DEPTH": "4"}, 2, NODE8).source == "aprun -d"
    pinned = thread_plan({"OMP_NUM_THREADS": "1"}, 2, CpuProbe(8, (0, 1, 2)))
    assert (pinned.cpus, pinned.source, pinned.note) == (3, "affinity mask", "")  # the mask wins over the variable


def test_variables_override_the_plan_and_arguments_override_variables() -> None:
    env = {"MLDIST_INTRA_OP": "6", "MLDIST_INTER_OP": "3"}
    plan = thread_plan(env, 2, NODE8)
    assert (plan.cpus, plan.intra_op, plan.inter_op) == (4, 6, 3)
    assert plan.overrides == "intra-op from MLDIST_INTRA_OP=6, inter-op from MLDIST_INTER_OP=3"
    plan = thread_plan(env, 2, NODE8, intra_op=1)
    assert (plan.intra_op, plan.inter_op) == (1, 3)
    assert plan.overrides.startswith("intra-op from init(intra_op=1)")


def test_empty_variables_are_unset() -> None:
    assert override_threads(ThreadPlan(2, 2, 1, "x"), {"MLDIST_INTRA_OP": " "}) == ThreadPlan(2, 2, 1, "x")


@pytest.mark.parametrize("value", [0, -2, "0", "-1", "two", "2.5", 2.0, True, ""])
def test_invalid_counts_name_the_value_and_the_fix(value: object) -> None:
    with pytest.raises(ConfigError, match=r"is not a thread count: give a whole number of 1 or more"):
        thread_count(value, "MLDIST_INTRA_OP")


def test_invalid_variable_or_argument_is_named() -> None:
    with pytest.raises(ConfigError, match=r"^MLDIST_INTER_OP='x' is not a thread count"):
        thread_plan({"MLDIST_INTER_OP": "x"}, 1, NODE8)
    with pytest.raises(ConfigError, match=r"^intra_op=-1 is not a thread count"):
        thread_plan({}, 1, NODE8, intra_op=-1)
