"""Process-wide patches in one place (mldist.runtime.start.patches), and a start-up hook that costs a
Python that is not a worker nothing of mldist."""

from __future__ import annotations

import ast
import atexit
import json
import os
import sys
from pathlib import Path

import pytest

from helpers import PY, ROOT, check, clean_env, mldist, run_py
from mldist.base import joined, processwide
from mldist.placement.detect import LAUNCHERS
from mldist.runtime.start import patches, startup
from mldist.runtime.watch import failures, leave

SRC = ROOT / "src" / "mldist"
HOOK = SRC / "runtime" / "hook" / "sitecustomize.py"
#: Roots whose attributes only mldist.runtime.start.patches assigns (what other code owns).
OWNED_ELSEWHERE = {"sys", "jax", "tf", "tensorflow", "keras", "builtins"}
#: Assignments that are not patches: the horovodrun alias hands its own argv to the parser it calls.
NOT_PATCHES = {("horovod/alias.py", "sys.argv")}


def _assignments(path: Path) -> list[str]:
    """``target`` of each assignment in ``path`` to an attribute of :data:`OWNED_ELSEWHERE`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else []
        targets += [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        for target in targets:
            root = target
            while isinstance(root, ast.Attribute):
                root = root.value
            if target is not root and isinstance(root, ast.Name) and root.id in OWNED_ELSEWHERE:
                found.append(ast.unparse(target))
    return found


def test_only_the_patches_module_replaces_what_others_own() -> None:
    found = {
        (str(path.relative_to(SRC)), target)
        for path in SRC.rglob("*.py")
        if path.name not in {"patches.py", "processwide.py"}
        for target in _assignments(path)
    }
    assert found == NOT_PATCHES, (
        f"install it in mldist.runtime.start.patches, with a PATCHES entry: {found - NOT_PATCHES}"
    )
    assert {"sys.exit", "jax.distributed.initialize"} <= set(_assignments(SRC / "runtime" / "start" / "patches.py"))
    assert {"sys.excepthook"} <= set(_assignments(SRC / "base" / "processwide.py"))


#: Where a worker's process-wide changes are made (each listed in its PATCHES), and mldist.preempt's opt-in
#: handlers, which users install themselves.
THE_ONE_PLACE = {"base/processwide.py", "preempt.py"}
#: The launcher's side: it changes its own process, never a worker's.
LAUNCHER_SIDE = ("launch/", "cli/", "tools/")
#: Calls that change the process, by their spelling.
CHANGING_CALLS = {"atexit.register", "signal.signal", "os.putenv", "os.unsetenv", "signal.siginterrupt"}
#: Mutable process-wide lists and mappings: a call of one of :data:`MUTATORS` on them, or a subscript write.
PROCESS_WIDE = {"os.environ", "environ", "sys.meta_path", "sys.path_hooks"}
MUTATORS = {"insert", "append", "extend", "remove", "pop", "popitem", "clear", "update", "setdefault", "__setitem__"}
#: Hooks of Python's that an assignment replaces.
HOOKS = {"sys.excepthook", "threading.excepthook", "sys.unraisablehook", "sys.meta_path", "sys.path_hooks"}


def _process_wide_changes(path: Path) -> list[str]:
    """Each exit handler, signal handler, logger filter, environment write, import hook or excepthook ``path``
    installs other than through :mod:`mldist.base.processwide` (``environ``: a parameter holding ``os.environ``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            owner = func.rsplit(".", 1)[0] if isinstance(node.func, ast.Attribute) else ""
            method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if func in CHANGING_CALLS or method == "addFilter" or (owner in PROCESS_WIDE and method in MUTATORS):
                found.append(func)
        targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else []
        targets += [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        for target in targets:
            written = ast.unparse(target.value) if isinstance(target, ast.Subscript) else None
            if ast.unparse(target) in HOOKS or written in PROCESS_WIDE:
                found.append(ast.unparse(target))
    return found


def test_process_wide_changes_in_a_worker_go_through_the_one_place() -> None:
    """In the code that runs inside a worker, every process-wide change is made by mldist.base.processwide,
    which lists it in PATCHES with its reason and switch."""
    found = {
        f"{rel}: {change}"
        for path in SRC.rglob("*.py")
        if not (rel := str(path.relative_to(SRC))).startswith(LAUNCHER_SIDE) and rel not in THE_ONE_PLACE
        for change in _process_wide_changes(path)
    }
    assert not found, f"make it with mldist.base.processwide, and give it a PATCHES entry: {sorted(found)}"
    assert {"atexit.register", "signal.signal", "sys.excepthook", "sys.meta_path.insert"} <= set(
        _process_wide_changes(SRC / "base" / "processwide.py")
    )


def test_the_process_wide_scan_finds_each_kind(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import atexit, os, signal, sys\n"
        "atexit.register(print)\nsignal.signal(signal.SIGTERM, print)\nsys.excepthook = print\n"
        "sys.meta_path.insert(0, None)\nos.environ['A'] = '1'\nos.environ.update(A='1')\n"
        "os.environ.setdefault('A', '1')\ndel os.environ['A']\nenviron['B'] = '2'\n"
        "logging.getLogger('tensorflow').addFilter(None)\n"
        "os.environ.get('A'); env['A'] = '1'; print(sys.meta_path)\n"
    )
    assert sorted(_process_wide_changes(sample)) == sorted(
        [
            "atexit.register",
            "signal.signal",
            "sys.excepthook",
            "sys.meta_path.insert",
            "os.environ['A']",
            "os.environ.update",
            "os.environ.setdefault",
            "os.environ['A']",
            "environ['B']",
            "logging.getLogger('tensorflow').addFilter",
        ]
    )


def test_each_process_wide_change_names_an_entry_of_the_table() -> None:
    """The target each call of mldist.base.processwide names is a PATCHES entry (a new one needs its reason)."""
    makers = {"at_exit", "on_signal", "set_env", "env_default", "update_env", "log_filter", "import_hook", "excepthook"}
    named = set()
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        strings = {
            ast.unparse(n.targets[0]): n.value.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in makers and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) or ast.unparse(first) in strings:
                    named.add(first.value if isinstance(first, ast.Constant) else strings[ast.unparse(first)])
    assert named - processwide.TARGETS == set()
    assert len(named) > 15


def test_a_change_the_table_does_not_list_is_refused() -> None:
    with pytest.raises(LookupError, match=r"not in mldist\.base\.processwide\.PATCHES"):
        processwide.set_env("os.environ: something new", "A", "1", {})


def test_the_scan_finds_a_patch(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import sys, jax\nsys.exit = print\njax.distributed.initialize = None\nx.y = 1\n")
    assert _assignments(sample) == ["sys.exit", "jax.distributed.initialize"]


def test_every_patch_says_why_and_its_switch() -> None:
    assert len({p.target for p in patches.PATCHES}) == len(patches.PATCHES)
    for patch in patches.PATCHES:
        assert patch.logic.startswith("mldist.") and patch.why and patch.switch, patch
    switches = " ".join(p.switch for p in patches.PATCHES)
    assert "MLDIST_HOOK=0" in switches and "MLDIST_GROUP_NOTE=0" in switches


def test_the_runtime_patches_install_what_they_list(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[object] = []
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # restored after the test
    monkeypatch.setattr(sys, "exit", sys.exit)
    monkeypatch.setattr(atexit, "register", registered.append)
    patches.one_line_errors()
    patches.exit_codes()
    assert sys.excepthook is failures.one_line_errors and sys.exit is leave.sys_exit
    assert registered == [leave.at_exit]
    assert {"sys.excepthook", "sys.exit, atexit"} <= set(patches.installed()) <= {p.target for p in patches.PATCHES}


#: At exit: the code ``sys.exit`` ended the interpreter with, as mldist's exit handler reads it.
ENDING = """
import atexit, sys
from mldist.runtime.start import patches
from mldist.runtime.watch import leave
patches.exit_codes()
atexit.register(lambda: print("ENDING", leave.ending_code(), flush=True))
try:
    sys.exit(2)  # caught, as argparse's in a library: not the end
except SystemExit:
    print("CAUGHT", leave.ending_code(), flush=True)
sys.exit(5)
"""


def test_the_exit_code_that_ends_the_interpreter_is_told_from_a_caught_one() -> None:
    res = run_py("-c", ENDING)
    assert res.returncode == 5 and res.stdout.split() == ["CAUGHT", "None", "ENDING", "5"], res.stdout + res.stderr


def _hook_constants() -> set[str]:
    return {n.value for n in ast.walk(ast.parse(HOOK.read_text())) if isinstance(n, ast.Constant)}


def test_the_hook_spells_the_launchers_markers_and_mldists_names_alike() -> None:
    """The hook may import nothing of mldist to tell a worker (every Python would pay for it)."""
    tree = ast.parse(HOOK.read_text())
    assigned = {ast.unparse(n.targets[0]): n.value for n in tree.body if isinstance(n, ast.Assign)}
    assert set(ast.literal_eval(assigned["_MARKERS"])) == {rule.marker for rule in LAUNCHERS} | {"TF_CONFIG"}
    assert {"MLDIST_HOOK", joined.SKIP_ENV, startup._FIRST} <= _hook_constants()


#: The mldist modules a Python imported at start-up, and its RANK (set by the hook in a worker).
SHOW = (
    "import json, os, sys; "
    "print('RESULT', json.dumps([sorted(m for m in sys.modules if m.startswith('mldist')), os.environ.get('RANK')]))"
)


def _with_hook(**extra: str) -> tuple[list[str], str | None]:
    env = clean_env(**extra)
    env["PYTHONPATH"] = os.pathsep.join([str(joined.hook_folder()), env["PYTHONPATH"]])
    res = check(run_py("-c", SHOW, env=env))
    line = next(line for line in res.stdout.splitlines() if line.startswith("RESULT "))
    modules, rank = json.loads(line.split(" ", 1)[1])
    return modules, rank


def test_the_hook_imports_nothing_of_mldist_in_a_python_that_is_not_a_worker() -> None:
    assert _with_hook() == ([], None)
    assert _with_hook(MLDIST_RANK="1", MLDIST_SIZE="2", MLDIST_HOOK="0") == ([], None)
    assert _with_hook(MLDIST_RANK="1", MLDIST_SIZE="2", MLDIST_HOOK_PID="1") == ([], None)  # a worker's child
    modules, rank = _with_hook(MLDIST_RANK="1", MLDIST_SIZE="2", MLDIST_WORKERS="h:1,h:2")
    assert "mldist.runtime.start.startup" in modules and rank == "1"


ALONE = ["--", PY, "-c", "import os; print('RANK', os.environ['RANK'])"]


def test_the_group_note_has_its_own_switch() -> None:
    """MLDIST_GROUP_NOTE=0: no never-formed line, while the hook still sets the tools' variables."""
    said = check(mldist(["run", "-n", "2", "--no-run-dir", *ALONE], env=clean_env(), timeout=60))
    quiet = check(mldist(["run", "-n", "2", "--no-run-dir", *ALONE], env=clean_env(MLDIST_GROUP_NOTE="0"), timeout=60))
    assert "never formed a group" in said.stderr and "never formed a group" not in quiet.stderr, quiet.stderr
    assert sorted(line.split()[-1] for line in quiet.stdout.splitlines() if "RANK" in line) == ["0", "1"]
