"""The tree is the pipeline: module sizes, function sizes and the direction of imports."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from helpers import PY, ROOT, check, clean_env

SRC = ROOT / "src" / "mldist"
MODULES = sorted(SRC.rglob("*.py"))

#: Pipeline stages, first to last: a module may import its own stage and earlier ones only.
STAGES: tuple[tuple[str, ...], ...] = (
    ("errors", "files"),
    ("placement",),
    ("launch",),
    ("runtime",),
    ("data", "datasets", "checkpoint", "preempt", "keras", "horovod", "profiling"),
    ("tools", "observe"),
    ("cli", "__main__"),
)


def _stage(parts: tuple[str, ...]) -> int:
    for index, names in enumerate(STAGES):
        if parts[0] in names:
            return index
    raise AssertionError(f"mldist.{'.'.join(parts)} is in no stage of STAGES; add its folder there")


def _parts(path: Path) -> tuple[str, ...]:
    rel = path.relative_to(SRC).with_suffix("")
    return tuple(p for p in rel.parts if p != "__init__") or ("__init__",)


def _imported(path: Path) -> set[tuple[str, ...]]:
    """mldist modules (as parts below mldist) that ``path`` imports, at any depth of the file."""
    here = _parts(path)
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            target = base + tuple(node.module.split(".")) if node.module else base
            found |= {(*target, alias.name) if not node.module else target for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mldist."):
            found.add(tuple(node.module.split("."))[1:])  # type: ignore[union-attr]
        elif isinstance(node, ast.Import):
            found |= {tuple(a.name.split("."))[1:] for a in node.names if a.name.startswith("mldist.")}
    return {t for t in found if t}


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
        if here == ("__init__",) or target == ("__init__",) or target[0] == "__version__":
            continue  # the facade re-exports; __version__ lives in it
        assert _stage(target) <= _stage(here), f"mldist.{'.'.join(here)} imports a later stage: {target}"


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


def test_public_names_keep_their_paths() -> None:
    import mldist

    for name in ("init", "rank", "size", "local_rank", "local_size", "is_chief", "strategy", "allreduce"):
        assert callable(getattr(mldist, name))
    for name in ("broadcast", "allgather", "DistributedGradientTape", "CheckpointManager"):
        assert callable(getattr(mldist, name))
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        _ = mldist.nonexistent  # type: ignore[attr-defined]
