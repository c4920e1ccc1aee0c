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
from mldist.base import joined
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
        if path.name != "patches.py"
        for target in _assignments(path)
    }
    assert found == NOT_PATCHES, (
        f"install it in mldist.runtime.start.patches, with a PATCHES entry: {found - NOT_PATCHES}"
    )
    assert {"sys.excepthook", "sys.exit", "jax.distributed.initialize"} <= set(
        _assignments(SRC / "runtime" / "start" / "patches.py")
    )


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
from mldist.runtime import leave, patches
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
