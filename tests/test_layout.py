"""The tree is the pipeline: module sizes, function sizes and the direction of imports."""

from __future__ import annotations

import ast
import io
import itertools
import re
import subprocess
import tokenize
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, check, clean_env

SRC = ROOT / "src" / "mldist"
MODULES = sorted(SRC.rglob("*.py"))

#: Pipeline stages, first to last: a module may import its own stage and earlier ones only.
STAGES: tuple[tuple[str, ...], ...] = (
    ("_version", "errors", "base"),
    ("placement",),
    ("launch",),
    ("runtime",),
    ("data", "checkpoint", "preempt", "keras", "horovod"),
    ("tools",),
    ("cli", "__main__"),
)


#: Training helpers and tools that start workers themselves (``hvd.run``, ``mldist bench``): they alone may
#: import the launcher, inside the function that starts them. Everything else they need of the run
#: directory or of processes is below the launcher, in mldist.base.
STARTS_WORKERS = {("horovod", "runner"): "run", ("tools", "bench"): "run_workers"}
#: The most entries src/mldist may have (modules and packages, __pycache__ not counted).
MOST_TOP_LEVEL = 15


def _stage(parts: tuple[str, ...]) -> int:
    for index, names in enumerate(STAGES):
        if parts[0] in names:
            return index
    raise AssertionError(f"mldist.{'.'.join(parts)} is in no stage of STAGES; add its folder there")


def _parts(path: Path) -> tuple[str, ...]:
    rel = path.relative_to(SRC).with_suffix("")
    return tuple(p for p in rel.parts if p != "__init__") or ("__init__",)


def _typing_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:``: imports for annotations, which never run."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            skipped |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}  # the else branch runs
    return skipped


def _import_sites(path: Path, runtime_only: bool = False) -> dict[tuple[str, ...], int]:
    """mldist modules (as parts below mldist) that ``path`` imports, at any depth, with the first line of each.

    Args:
        path: a module below ``src/mldist``.
        runtime_only: leave out the imports under ``if TYPE_CHECKING:`` (they never run).

    Example: ``from .groups import Group`` on line 29 of launch/local.py gives ``{("launch", "groups"): 29}``.
    """
    package = path.parent.relative_to(SRC).parts  # () for the facade and the top-level modules
    tree = ast.parse(path.read_text())
    skipped = _typing_only(tree) if runtime_only else set()
    found: dict[tuple[str, ...], int] = {}
    for node in ast.walk(tree):
        targets: set[tuple[str, ...]] = set()
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            target = base + tuple(node.module.split(".")) if node.module else base
            targets = {(*target, alias.name) if not node.module else target for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mldist."):
            targets = {tuple(node.module.split("."))[1:]}  # type: ignore[union-attr]
        elif isinstance(node, ast.Import):
            targets = {tuple(a.name.split("."))[1:] for a in node.names if a.name.startswith("mldist.")}
        for target in targets - {()}:
            found[target] = min(found.get(target, node.lineno), node.lineno)  # ast.walk is not in line order
    return found


def _imported(path: Path) -> set[tuple[str, ...]]:
    """mldist modules (as parts below mldist) that ``path`` imports, at any depth of the file."""
    return set(_import_sites(path))


def _third_party(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(SRC)) for p in MODULES])
def test_imports_run_one_way(path: Path) -> None:
    here = _parts(path)
    for target in _imported(path):
        assert target[0] != "cli" or here[0] in ("cli", "__main__"), f"{here} imports the CLI"
        if here == ("__init__",):
            continue  # the facade re-exports
        assert _stage(target) <= _stage(here), f"mldist.{'.'.join(here)} imports a later stage: {target}"


def test_every_stage_names_what_is_there_and_the_top_level_stays_small() -> None:
    top = {p.stem for p in SRC.iterdir() if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py")}
    named = {name for names in STAGES for name in names}
    assert named <= top, f"STAGES names what src/mldist does not have: {sorted(named - top)}"
    assert top - named <= {"__init__"}, f"in no stage: {sorted(top - named - {'__init__'})}"
    assert len(top) <= MOST_TOP_LEVEL, f"src/mldist has {len(top)} entries: {sorted(top)}"


def _launcher_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, enclosing function)`` of each import of mldist.launch in ``path`` ("" at module level)."""
    tree = ast.parse(path.read_text())
    within: dict[int, str] = {}  # node id -> the innermost function around it (walked outer first)
    for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        within |= {id(inner): func.name for stmt in func.body for inner in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if any(n == "launch" or n.startswith(("launch.", "mldist.launch")) for n in names):
            found.append((node.lineno, within.get(id(node), "")))
    return found


HELPERS_AND_TOOLS = [p for p in MODULES if _parts(p)[0] in (*STAGES[4], *STAGES[5])]


@pytest.mark.parametrize("path", HELPERS_AND_TOOLS, ids=[str(p.relative_to(SRC)) for p in HELPERS_AND_TOOLS])
def test_training_helpers_and_tools_do_not_import_the_launcher(path: Path) -> None:
    allowed = STARTS_WORKERS.get(_parts(path))
    for line, function in _launcher_imports(path):
        assert function and function == allowed, (
            f"{path.relative_to(SRC)}:{line} imports mldist.launch; what the workers and tools share of the "
            "run directory and processes is in mldist.base"
        )


@pytest.mark.parametrize("path", sorted((SRC / "placement").rglob("*.py")), ids=lambda p: p.name)
def test_placement_is_free_of_tensorflow_and_mpi(path: Path) -> None:
    assert not _third_party(path) & {"tensorflow", "keras", "tf_keras", "mpi4py", "numpy"}


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(SRC)) for p in MODULES])
def test_modules_and_functions_stay_small(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= 400, f"{path.name} has {len(text.splitlines())} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            assert length <= 60, f"{path.name}:{node.lineno} {node.name}() has {length} lines"


def test_import_mldist_stays_free_of_tensorflow_and_submodules_are_lazy() -> None:
    code = (
        "import sys, mldist; assert 'tensorflow' not in sys.modules, 'tensorflow imported'; "
        "assert 'mldist.keras' not in sys.modules; "
        "import mldist.cli; assert 'tensorflow' not in sys.modules, 'cli imported tensorflow'; "
        "print(mldist.data.__name__, mldist.preempt.__name__, mldist.keras.DistributedOptimizer.__name__)"
    )
    res = check(subprocess.run([PY, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=120))
    assert res.stdout.split() == ["mldist.data", "mldist.preempt", "DistributedOptimizer"]


def test_import_mldist_loads_at_most_15_of_its_modules() -> None:
    """Issue 63: each of 10,000 ranks reads every module it imports from the shared file system; the
    facade and the runtime import their names on first use (44 modules before)."""
    code = "import mldist"
    res = check(subprocess.run([PY, "-X", "importtime", "-c", code], capture_output=True, text=True, env=clean_env()))
    loaded = [line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")]
    ours = [name for name in loaded if name.split(".")[0] == "mldist"]
    assert 0 < len(ours) <= 15, ours
    names = "import mldist as m; print(m.init.__module__, m.allreduce.__module__, m.CheckpointManager.__name__)"
    res = check(subprocess.run([PY, "-c", names], capture_output=True, text=True, env=clean_env(), timeout=120))
    assert res.stdout.split() == [
        "mldist.runtime.start.worker",
        "mldist.runtime.collect.collectives",
        "CheckpointManager",
    ]


def test_public_names_keep_their_paths() -> None:
    import mldist

    for name in ("init", "rank", "size", "local_rank", "local_size", "is_chief", "strategy", "allreduce"):
        assert callable(getattr(mldist, name))
    for name in ("broadcast", "allgather", "DistributedGradientTape", "CheckpointManager"):
        assert callable(getattr(mldist, name))
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        _ = mldist.nonexistent  # type: ignore[attr-defined]


#: Every package folder: its modules and subpackages must not import each other in a circle.
PACKAGES = sorted(p.parent for p in SRC.rglob("__init__.py"))
#: The names below mldist that are modules or packages (importing one of them is no read of the facade).
SUBMODULES = {p.stem for p in SRC.iterdir() if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py")}


def _facade_reads(path: Path) -> list[str]:
    """``line: name`` of each import in ``path`` that takes a name from the facade (``mldist/__init__.py``)."""
    package = path.parent.relative_to(SRC).parts
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level and not node.module and node.level > len(package):
            names = [a.name for a in node.names]  # ``from .. import x`` reaching src/mldist itself
        elif isinstance(node, ast.ImportFrom) and node.module == "mldist":
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name == "mldist"]
        else:
            continue
        found += [f"{node.lineno}: {name}" for name in names if name not in SUBMODULES]
    return found


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(SRC)) for p in MODULES])
def test_no_module_reads_the_facade(path: Path) -> None:
    """The facade imports the stages; a stage that imported a name back from it would run against the pipeline."""
    if _parts(path) in (("__init__",), ("__main__",)):
        return
    assert not _facade_reads(path), f"{path.relative_to(SRC)} imports from the facade: {_facade_reads(path)}"


def _member(path: Path, folder: Path) -> str:
    """The member of ``folder`` that ``path`` belongs to: its module, or its subpackage as a whole."""
    rel = path.relative_to(folder).parts
    return rel[0] if len(rel) > 1 else path.stem  # "__init__" for the folder's own package module


def _import_graph(folder: Path) -> dict[str, dict[str, str]]:
    """Runtime imports between the members of one package folder: ``{importer: {imported: "file:line"}}``.

    A subpackage is one member whose imports are those of all its modules (importing any of them
    runs its ``__init__``). Importing the folder's package itself, or a name defined in its
    ``__init__.py``, imports the member ``__init__``. Imports inside functions count: a
    function-local import does not remove a circle, it only defers it.

    Args:
        folder: a package folder below ``src/mldist``.
    """
    package = folder.relative_to(SRC).parts
    paths = sorted(folder.rglob("*.py"))
    members = {_member(p, folder) for p in paths}
    graph: dict[str, dict[str, str]] = {m: {} for m in members}
    for path in paths:
        importer = _member(path, folder)
        for target, line in _import_sites(path, runtime_only=True).items():
            if target[: len(package)] != package:
                continue  # outside this folder
            rest = target[len(package) :]
            imported = rest[0] if rest and rest[0] in members else "__init__"
            if imported != importer:
                graph[importer].setdefault(imported, f"{path.relative_to(SRC)}:{line}")
    return graph


def _circles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with two members or more, each sorted."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[start] = seen
    components = {frozenset({a, *(b for b in reach[a] if a in reach[b])}) for a in graph}
    return sorted(sorted(c) for c in components if len(c) > 1)


def _cycle(graph: dict[str, dict[str, str]], component: list[str]) -> str:
    """One import cycle through the component's first member, with the line of each import."""
    start = component[0]
    paths = {start: [start]}
    todo = [start]
    while todo:  # breadth first: the shortest way back to the start
        here = todo.pop(0)
        for nxt in graph[here]:
            if nxt == start:
                hops = [*paths[here], start]
                sites = "; ".join(f"{graph[a][b]} imports {b}" for a, b in itertools.pairwise(hops))
                return f"{' -> '.join(hops)} ({sites})"
            if nxt in component and nxt not in paths:
                paths[nxt] = [*paths[here], nxt]
                todo.append(nxt)
    raise AssertionError(f"no cycle through {start} in {component}")


def _package_param(folder: Path) -> Any:
    """One case of the circle test, named after the folder (``mldist`` for the top level)."""
    name = "/".join(folder.relative_to(SRC).parts) or "mldist"
    return pytest.param(folder, id=name)


@pytest.mark.parametrize("folder", [_package_param(f) for f in PACKAGES])
def test_no_import_circle_within_a_package(folder: Path) -> None:
    graph = _import_graph(folder)
    found = [f"{', '.join(c)}: {_cycle(graph, c)}" for c in _circles(graph)]
    assert not found, (
        f"import circle in {'/'.join(('mldist', *folder.relative_to(SRC).parts))}: "
        + "; ".join(found)
        + (" (move the shared code into a module both import; a function-local import only hides the circle)")
    )


#: runtime/'s rooms, bottom to top: a member imports its own floor and lower ones only (issue 63).
RUNTIME_FLOORS: tuple[tuple[str, ...], ...] = (
    ("context", "compat"),
    ("watch",),
    ("engines",),
    ("start", "hook"),
    ("collect",),
    ("__init__",),
)
#: The most modules runtime/ keeps at its top level; the rest live in its subpackages.
MOST_RUNTIME_MODULES = 6


def test_runtime_floors_import_downwards() -> None:
    graph = _import_graph(SRC / "runtime")
    floor = {name: index for index, names in enumerate(RUNTIME_FLOORS) for name in names}
    assert set(graph) == set(floor), f"runtime members without a floor in RUNTIME_FLOORS: {set(graph) ^ set(floor)}"
    up = [
        f"{a} imports {b} ({site})"
        for a, targets in graph.items()
        for b, site in targets.items()
        if floor[b] > floor[a]
    ]
    assert not up, "arrows back up inside mldist.runtime: " + "; ".join(sorted(up))


def test_runtime_keeps_few_modules_at_its_top() -> None:
    top = sorted(p.name for p in (SRC / "runtime").glob("*.py"))
    assert len(top) <= MOST_RUNTIME_MODULES, (
        f"runtime/ has {len(top)} top-level modules ({top}); move some into a subpackage"
    )


#: The engines' and backends' names: code outside the decisions asks the engine or the backend's traits.
ENGINE_NAMES = {"mpi", "ring", "nccl", "jax", "tensorflow"}
#: Where those names may be compared: the decisions, the engine modules themselves, the CLI's argument parsing.
NAMES_COMPARED = {
    ("placement", "engines"),
    ("placement", "backend"),
    ("runtime", "engines", "engine"),
    ("runtime", "engines", "mpi_engine"),
    ("runtime", "engines", "mpi_world"),
    ("runtime", "engines", "tf_engine"),
    ("runtime", "engines", "jax_engine"),
}


def _named_constants(node: ast.expr) -> set[str]:
    """The engine names among the string constants of ``node`` (a constant, or a tuple/list/set of them)."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return {i.value for i in items if isinstance(i, ast.Constant) and i.value in ENGINE_NAMES}


def _name_comparisons(path: Path) -> list[str]:
    """``line: code`` of each comparison in ``path`` against an engine or backend name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare) and any(_named_constants(x) for x in (node.left, *node.comparators)):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(SRC)) for p in MODULES])
def test_engine_and_backend_names_are_compared_only_where_they_are_decided(path: Path) -> None:
    parts = _parts(path)
    if parts in NAMES_COMPARED or parts[0] == "cli":
        return
    assert not _name_comparisons(path), (
        f"{path.relative_to(SRC)} compares engine or backend names: {_name_comparisons(path)}; ask the engine "
        "(mldist.runtime.engines.engine.running()'s flags) or the decision (ctx.decision.traits, Decision's properties)"
    )


def test_the_name_scan_finds_comparisons(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('if ctx.communication == "mpi" or name in ("ring", "nccl") or "jax" != b:\n    pass\n')
    assert [line.split(": ", 1)[1] for line in _name_comparisons(sample)] == [
        "ctx.communication == 'mpi'",
        "name in ('ring', 'nccl')",
        "'jax' != b",
    ]
    sample.write_text('if kind in ("openmpi", "mpich") or x == "none":\n    pass\n')
    assert not _name_comparisons(sample)


#: The ``mldist run`` launcher's modules: they read the environment only through ``local.inherited``.
#: The shims (shim, remote_shim) are not among them: they run in each rank's own process, before the command.
LAUNCHER = [p for p in sorted((SRC / "launch").glob("*.py")) if p.stem not in ("shim", "remote_shim")]


def _environ_reads(path: Path) -> list[tuple[int, str]]:
    """``(line, enclosing function)`` of each use of ``os.environ``/``os.getenv`` in ``path``."""
    tree = ast.parse(path.read_text())
    within: dict[int, str] = {}
    for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        within |= {id(inner): func.name for stmt in func.body for inner in ast.walk(stmt)}
    return [
        (node.lineno, within.get(id(node), ""))
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and ast.unparse(node.value) == "os"
    ]


@pytest.mark.parametrize("path", LAUNCHER, ids=lambda p: p.name)
def test_the_launcher_reads_the_environment_in_one_function(path: Path) -> None:
    allowed = "inherited" if path.stem == "local" else None
    for line, function in _environ_reads(path):
        assert function == allowed, (
            f"launch/{path.name}:{line} reads os.environ; take the environment local.inherited() gives "
            "(RunConfig.env is what the workers get beyond it)"
        )


def test_the_launcher_has_its_one_read() -> None:
    assert [f for _, f in _environ_reads(SRC / "launch" / "local.py")] == ["inherited"]


def _environ_writes(path: Path) -> list[int]:
    """Lines of ``path`` that change this process's environment (``os.environ[...] =``, ``.update``, ``putenv``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else []
        targets += [node.target] if isinstance(node, ast.AugAssign) else []
        targets += node.targets if isinstance(node, ast.Delete) else []
        if any(isinstance(t, ast.Subscript) and ast.unparse(t.value) == "os.environ" for t in targets):
            found.append(node.lineno)
        if isinstance(node, ast.Call) and ast.unparse(node.func) in (
            *(f"os.environ.{m}" for m in ("update", "setdefault", "pop", "popitem", "clear")),
            "os.putenv",
            "os.unsetenv",
        ):
            found.append(node.lineno)
    return found


@pytest.mark.parametrize("path", sorted((SRC / "cli").glob("*.py")), ids=lambda p: p.name)
def test_the_cli_hands_the_workers_environment_over_in_the_config(path: Path) -> None:
    assert not _environ_writes(path), (
        f"cli/{path.name} changes os.environ at lines {_environ_writes(path)}: put what the workers need in "
        "RunConfig.env (or pass it to the function that runs the work)"
    )


def test_the_write_scan_finds_writes(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('import os\nos.environ["A"] = "1"\nos.environ.update(B="2")\nx = os.environ.get("C")\n')
    assert _environ_writes(sample) == [2, 3]


#: The one module that spells ``MLDIST_*`` names: the table of the launcher-worker contract.
CONTRACT = SRC / "base" / "envvalues.py"
#: For good: the workers' start-up hook runs in every Python before it may import mldist, so it spells the
#: names it reads (tests/runtime/test_envvalues.py checks they are the table's).
SPELLS_ITS_OWN = {"runtime/hook/sitecustomize.py"}
#: Where a string spells a variable: it starts with one (a key, ``NAME=value``), or, in the launcher's
#: modules, the shell they generate uses one (``$NAME``, ``${NAME:-}``, ``export NAME``). Prose may mention
#: names (``raise NAME if ...``), and so may the examples of ``--help``.
_NAME_FIRST = re.compile(r"[rRbBuUfF]*('''|\"\"\"|'|\")MLDIST_[A-Z]")
_IN_SHELL = re.compile(r"\$\{*MLDIST_[A-Z]|\bexport MLDIST_[A-Z]")


def _string_tokens(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of each string literal, f-strings whole (Python 3.12 splits them into tokens)."""
    found, lines, depth = [], source.splitlines(keepends=True), 0
    start: tuple[int, int] = (0, 0)
    fstring_start, fstring_end = getattr(tokenize, "FSTRING_START", -1), getattr(tokenize, "FSTRING_END", -1)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING and not depth:
            found.append((tok.start[0], tok.string))
        elif tok.type == fstring_start:
            start, depth = (start if depth else tok.start), depth + 1
        elif tok.type == fstring_end:
            depth -= 1
            if not depth:
                text = "".join(lines[start[0] - 1 : tok.end[0]])
                found.append((start[0], text[start[1] : len(text) - len(lines[tok.end[0] - 1]) + tok.end[1]]))
    return found


def _docstring_lines(tree: ast.Module) -> set[int]:
    nodes = [
        n for n in ast.walk(tree) if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    return {
        n.body[0].lineno
        for n in nodes
        if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
    }


def _spelled_names(path: Path, shell: bool = True) -> list[str]:
    """``line: code`` of each place ``path`` spells an ``MLDIST_*`` variable in code (not in a docstring).

    Args:
        path: the module.
        shell: also the names in shell text (``$NAME``, ``export NAME``): the launcher's modules write job scripts.
    """
    source = path.read_text()
    tree = ast.parse(source)
    docs = _docstring_lines(tree)
    found = [
        f"{line}: {text[:60]}"
        for line, text in _string_tokens(source)
        if line not in docs and (_NAME_FIRST.match(text) or (shell and _IN_SHELL.search(text)))
    ]
    keywords = [n for n in ast.walk(tree) if isinstance(n, ast.keyword) and (n.arg or "").startswith("MLDIST_")]
    return found + [f"{n.value.lineno}: {n.arg}=" for n in keywords]


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(SRC)) for p in MODULES])
def test_only_the_contract_table_spells_mldist_variables(path: Path) -> None:
    rel = path.relative_to(SRC).as_posix()
    if path == CONTRACT or rel in SPELLS_ITS_OWN:
        return
    found = _spelled_names(path, shell=rel.startswith("launch/"))
    assert not found, (
        f"{rel} spells MLDIST_* variables: {found}; take the name from the table "
        "(mldist.base.envvalues: envvalues.RANK.name, envvalues.shell('$@JOB_DIR@') in generated shell), "
        "or add the variable there"
    )


def test_the_contract_scan_finds_names(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Reads MLDIST_RANK (prose: fine)."""\n'
        'env = {"MLDIST_RANK": "0"}\n'
        'line = f"MLDIST_SIZE={n}"\n'
        'env.update(MLDIST_WORKERS="h:1")\n'
        "shell = 'mkdir -p \"$MLDIST_JOB_DIR\"'\n"
        "ok = 'raise MLDIST_COLLECTIVE_TIMEOUT if it is too short'\n"
        'x = ("a " "MLDIST_RESTART")\n'
        "mark = f'[ -n \"${{MLDIST_MARK:-}}\" ] && exit {code}'\n"
    )
    assert [found.split(":")[0] for found in _spelled_names(sample)] == ["2", "3", "5", "7", "8", "4"]
    assert [found.split(":")[0] for found in _spelled_names(sample, shell=False)] == ["2", "3", "7", "4"]


#: The methods that read one variable of a mapping (``env.get``, ``os.getenv``): writes stay free.
_READERS = {"get", "getenv"}


def _table_name(node: ast.expr) -> bool:
    """Whether ``node`` is ``envvalues.X.name``: the name of a variable of the table."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "name"
        and isinstance(node.value, ast.Attribute)
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "envvalues"
    )


def _raw_reads(path: Path) -> list[str]:
    """``line: code`` of each place ``path`` reads a table variable's text itself: ``<m>.get(envvalues.X.name``
    or ``<m>[envvalues.X.name]`` as a value (writes such as ``env[envvalues.X.name] = "1"`` are fine)."""
    tree = ast.parse(path.read_text())
    found = [
        n
        for n in ast.walk(tree)
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in _READERS
            and n.args
            and _table_name(n.args[0])
        )
        or (isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) and _table_name(n.slice))
    ]
    return [f"{n.lineno}: {ast.unparse(n)[:60]}" for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))]


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(SRC)) for p in MODULES])
def test_only_the_contract_table_reads_mldist_variables(path: Path) -> None:
    if path == CONTRACT:
        return
    found = _raw_reads(path)
    assert not found, (
        f"{path.relative_to(SRC).as_posix()} reads MLDIST_* variables' text itself: {found}; read them "
        "through the table (envvalues.RUN_DIR.read(env)): its parser and default, one error line for a bad value"
    )


def test_the_read_scan_finds_reads(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\n"
        "from mldist.base import envvalues\n"
        "a = env.get(envvalues.RUN_DIR.name)\n"
        'b = os.environ.get(envvalues.RANK.name, "")\n'
        "c = env[envvalues.WORKERS.name].split(',')\n"
        'env[envvalues.TF_CONFIG.name] = "1"\n'
        'worker = {envvalues.RANK.name: "0"}\n'
        "d = envvalues.RUN_DIR.read(env)\n"
        "e = os.getenv(\n    envvalues.HOST.name)\n"
        "del env[envvalues.HOST.name]\n"
        "f = env.get(other.RUN_DIR.name), env.pop(envvalues.HOST.name, None)\n"
    )
    assert [found.split(":")[0] for found in _raw_reads(sample)] == ["3", "4", "5", "9"]
