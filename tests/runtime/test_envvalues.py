"""mldist's own environment values: a yes/no read one way everywhere, counts and seconds with bounds."""

from __future__ import annotations

import ast

import pytest

from helpers import ROOT
from mldist.base import envvalues
from mldist.base.joined import required, with_hook
from mldist.base.rundir import plot_wanted
from mldist.errors import ConfigError
from mldist.placement.cluster import port_base
from mldist.placement.common import strategy_note
from mldist.placement.resources import cpus_per_task_from
from mldist.runtime.jax_cpu import wants_idle_loop


@pytest.mark.parametrize(("raw", "value"), [("1", True), ("Yes", True), (" TRUE ", True), ("0", False), ("no", False)])
def test_every_yes_no_reader_takes_the_same_words(raw: str, value: bool) -> None:
    assert required({"MLDIST_REQUIRE_GROUP": raw}) is value
    assert plot_wanted({"MLDIST_PLOT": raw}) is value
    assert (with_hook({"MLDIST_HOOK": raw}) != {}) is value
    assert wants_idle_loop("gloo", {"MLDIST_GLOO_IDLE": raw}) is value
    assert bool(strategy_note({"MLDIST_TF_CONFIG": raw}, True)) is value


@pytest.mark.parametrize("raw", ["maybe", "on", "off", "2", "y", "ja"])
def test_any_other_word_is_refused_naming_the_variable_the_value_and_the_words(raw: str) -> None:
    with pytest.raises(ConfigError, match=rf"^MLDIST_REQUIRE_GROUP='{raw}' is not yes or no: set it to 1, yes or true"):
        required({"MLDIST_REQUIRE_GROUP": raw})


def test_blank_is_unset_and_keeps_the_documented_defaults() -> None:
    blank = {s.name: " " for s in envvalues.WORKER_SETTINGS}
    assert envvalues.problems(blank) == []
    assert (required(blank), plot_wanted(blank), with_hook(blank) != {}, port_base(blank)) == (False, True, True, 20000)
    assert cpus_per_task_from(blank) is None


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("MLDIST_PORT_BASE", "70000"),
        ("MLDIST_PORT_BASE", "80"),
        ("MLDIST_PORT_BASE", "２００００"),  # fullwidth digits: int() would take them
        ("MLDIST_CPUS_PER_TASK", "-3"),
        ("MLDIST_CPUS_PER_TASK", "0"),
        ("MLDIST_COLLECTIVE_TIMEOUT", "1e400"),  # float() makes it inf
        ("MLDIST_COLLECTIVE_TIMEOUT", "1_0"),
    ],
)
def test_counts_and_seconds_out_of_bounds_are_one_line(name: str, raw: str) -> None:
    (line,) = envvalues.problems({name: raw})
    assert line.startswith(f"{name}={raw!r} is not ") and "\n" not in line


def test_our_cpu_count_is_refused_but_an_inherited_one_is_skipped() -> None:
    with pytest.raises(ConfigError, match=r"^MLDIST_CPUS_PER_TASK='-3' is not a CPU count"):
        cpus_per_task_from({"MLDIST_CPUS_PER_TASK": "-3", "OMP_NUM_THREADS": "4"})
    assert cpus_per_task_from({"SLURM_CPUS_PER_TASK": "-3", "OMP_NUM_THREADS": "4"}) == (4, "OMP_NUM_THREADS")


def test_the_start_up_hook_spells_the_same_no_words() -> None:
    """The hook may not import mldist to read MLDIST_HOOK (every Python would pay for it)."""
    tree = ast.parse((ROOT / "src" / "mldist" / "runtime" / "hook" / "sitecustomize.py").read_text())
    assigned = {ast.unparse(n.targets[0]): n.value for n in tree.body if isinstance(n, ast.Assign)}
    words = ast.literal_eval(assigned["_OFF"])
    assert words == envvalues.FALSE
