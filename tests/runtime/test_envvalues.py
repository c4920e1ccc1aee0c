"""mldist's own environment values: a yes/no read one way everywhere, counts and seconds with bounds."""

from __future__ import annotations

import ast
import os
import re

import pytest

from helpers import ROOT
from mldist.base import envparse, envvalues
from mldist.base.joined import required, with_hook
from mldist.base.rundir import plot_wanted
from mldist.errors import ConfigError
from mldist.placement.cluster import port_base
from mldist.placement.common import strategy_note
from mldist.placement.resources import cpus_per_task_from
from mldist.runtime.engines.jax_cpu import wants_idle_loop


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


def test_the_table_names_each_variable_once_after_its_entry() -> None:
    entries = {attr: value for attr, value in vars(envvalues).items() if isinstance(value, envvalues.Setting)}
    assert set(envvalues.ALL) == set(entries.values()) and len(envvalues.ALL) == len(entries)
    assert {attr: s.name for attr, s in entries.items()} == {attr: f"MLDIST_{attr}" for attr in entries}
    assert set(envvalues.WORKER_SETTINGS) <= set(envvalues.ALL)


@pytest.mark.parametrize("setting", envvalues.ALL, ids=lambda s: s.name)
def test_every_entry_says_what_it_does_who_sets_it_and_what_it_takes(setting: envvalues.Setting[object]) -> None:
    assert setting.doc and "\n" not in setting.doc and len(setting.doc) <= 160  # one table row
    assert setting.by and set(setting.by) <= {envparse.USER, envparse.LAUNCHER, envparse.BATCH, envparse.WORKER}
    assert setting.kind
    assert setting.read({}) == setting.default  # unset: the default, never an error


def test_every_variable_the_readme_names_is_in_the_table() -> None:
    # The README and the documentation site (docs/, where the README's sections went in issue 52).
    texts = [(ROOT / "README.md").read_text(), *(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md")))]
    named = set(re.findall(r"MLDIST_[A-Z0-9_]*[A-Z0-9]\b(?!_)", "\n".join(texts)))
    named -= {"MLDIST_UPDATE_GOLDEN"}  # the test suite's own switch, not a setting of mldist
    assert named and named <= {s.name for s in envvalues.ALL}


def test_launchers_read_their_values_back_through_the_table() -> None:
    """What mldist run writes for a worker is what the table reads (a launcher-worker round trip)."""
    from mldist.launch.config import RunConfig
    from mldist.launch.procs import worker_env

    env = worker_env({}, RunConfig(nprocs=3, command=("python",)), 2, ["h:1", "h:2", "h:3"], "r9", restart=4)
    read = [s.read(env) for s in (envvalues.RANK, envvalues.SIZE, envvalues.RESTART, envvalues.RUN_ID)]
    assert read == [2, 3, 4, "r9"]
    assert envvalues.LAUNCHER_PID.read(env) == os.getpid() and envvalues.WORKERS.read(env) == ("h:1", "h:2", "h:3")


@pytest.mark.parametrize(
    ("setting", "raw"),
    [
        (envvalues.LAUNCHER_PID, "0"),
        (envvalues.LAUNCHER_PID, "99999999999"),  # past any pid (os.kill would overflow)
        (envvalues.LAUNCHER_PID, "１２"),  # fullwidth digits: int() would take them
    ],
)
def test_a_bad_launcher_pid_is_one_line(setting: envvalues.Setting[object], raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        setting.read({setting.name: raw})
    assert str(info.value).startswith(f"{setting.name}={raw!r} is not ") and "\n" not in str(info.value)


def test_address_lists_and_pids_read_as_values() -> None:
    assert envvalues.WORKERS.read({"MLDIST_WORKERS": " h1:1 , [::1]:2,"}) == ("h1:1", "[::1]:2")
    assert envvalues.WORKERS.read({"MLDIST_WORKERS": ",,"}) == ()  # set, but no address: the count check says so
    assert envvalues.LAUNCHER_PID.read({"MLDIST_LAUNCHER_PID": " 42 "}) == 42
    # A pid set by hand that is not one leaves the worker unwatched, as an unset one does.
    from mldist.runtime.watch.watchdog import watch_launcher

    assert not watch_launcher({"MLDIST_LAUNCHER_PID": "abc"}) and not watch_launcher({})


def test_generated_shell_spells_names_from_the_table() -> None:
    assert envvalues.shell('"$@JOB_DIR@/a" ${w[@]+"${w[@]}"} "$@"') == '"$MLDIST_JOB_DIR/a" ${w[@]+"${w[@]}"} "$@"'
    with pytest.raises(KeyError, match="JOB_DIRS"):
        envvalues.shell("$@JOB_DIRS@")


def test_the_start_up_hook_reads_only_variables_of_the_table() -> None:
    """The hook spells the names it reads (it may not import mldist before it knows it is a worker)."""
    tree = ast.parse((ROOT / "src" / "mldist" / "runtime" / "hook" / "sitecustomize.py").read_text())
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    spelled = {s for s in strings if re.fullmatch(r"MLDIST_[A-Z0-9_]+", s)}
    assert spelled and spelled <= {s.name for s in envvalues.ALL}


SRC = ROOT / "src" / "mldist"
#: The table, and the start-up hook (it may import nothing of mldist: test_the_start_up_hook_reads_only_...).
READS_RAW = {"base/envvalues.py", "base/envparse.py", "runtime/hook/sitecustomize.py"}


def _spelled_by_the_table(node: ast.AST) -> bool:
    """``envvalues.X.name``: a contract variable's name, taken from its entry."""
    inner = node.value if isinstance(node, ast.Attribute) and node.attr == "name" else None
    return (
        isinstance(inner, ast.Attribute)
        and inner.attr.isupper()
        and isinstance(inner.value, ast.Name)
        and inner.value.id == "envvalues"
    )


def _name_holders(trees: dict[str, ast.Module]) -> set[str]:
    """Constants that hold a contract variable's name (``RUN_DIR_ENV = envvalues.RUN_DIR.name``, and copies)."""
    held: set[str] = set()
    for _ in range(2):  # copies of copies (commits.RUN_ENV = rejoin.RUN_ENV)
        for tree in trees.values():
            for node in tree.body:  # module constants
                if isinstance(node, ast.Assign):
                    values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                    names = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else node.targets
                    for target, value in zip(names, values, strict=False):
                        holds = _spelled_by_the_table(value) or ast.unparse(value).split(".")[-1] in held
                        if isinstance(target, ast.Name) and target.id.lstrip("_").isupper() and holds:
                            held.add(target.id)
    return held


def _raw_reads(tree: ast.Module, held: set[str]) -> list[str]:
    """Each ``env.get(NAME)``, ``os.getenv(NAME)`` or ``env[NAME]`` read of a contract variable in ``tree``."""

    def contract(node: ast.AST) -> bool:
        return _spelled_by_the_table(node) or ast.unparse(node).split(".")[-1] in held

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and contract(node.args[0]):
            if ast.unparse(node.func).split(".")[-1] in {"get", "getenv"}:
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and contract(node.slice):
            found.append(ast.unparse(node))
    return found


def test_no_module_reads_a_contract_variable_but_through_the_table() -> None:
    """``envvalues.X.read(env)``: one parser, one meaning of blank, one error line; launchers write names."""
    trees = {str(p.relative_to(SRC)): ast.parse(p.read_text()) for p in SRC.rglob("*.py")}
    held = _name_holders(trees)
    assert {"RUN_DIR_ENV", "NOTES", "FOLDER_ENV", "ENV_CACHE", "RUN_ENV"} <= held
    found = {f"{rel}: {read}" for rel, tree in trees.items() if rel not in READS_RAW for read in _raw_reads(tree, held)}
    assert not found, f"read it with its entry, envvalues.X.read(env): {sorted(found)}"


def test_the_raw_read_scan_finds_each_spelling() -> None:
    tree = ast.parse(
        "A_ENV = envvalues.RUN_DIR.name\nB = mod.A_ENV\n"
        "env.get(A_ENV); os.environ.get(B, ''); os.getenv(envvalues.NOTES.name); env[mod.A_ENV]\n"
        "env[A_ENV] = 'x'; envvalues.RUN_DIR.read(env); env.get('HOME')\n"
    )
    held = _name_holders({"m": tree})
    assert held == {"A_ENV", "B"}
    assert sorted(_raw_reads(tree, held)) == sorted(
        ["env.get(A_ENV)", "os.environ.get(B, '')", "os.getenv(envvalues.NOTES.name)", "env[mod.A_ENV]"]
    )
