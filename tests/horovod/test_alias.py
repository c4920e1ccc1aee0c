"""``python -m mldist.horovod.alias``: what it refuses, and Horovod's other frameworks, in one line each.

Every process here stops before TensorFlow is imported (the refusals come first, and a script's
``import horovod.torch`` fails at once), so each costs a Python start-up.
tests/cli/test_bad_input.py holds the first refusals (no argument, ``-m`` alone, an option first,
a missing script or module).
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from helpers import PY, clean_env, mldist

PROG = "python -m mldist.horovod.alias"
#: What must not be imported before a refusal: Python started and read the command line, nothing more.
FRAMEWORKS = {"tensorflow", "keras", "jax", "torch"}


def _alias(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], list[str], set[str]]:
    """``python -m mldist.horovod.alias ARGS`` in ``cwd``: the result, its stderr lines, the modules it imported."""
    argv = [PY, "-X", "importtime", "-m", "mldist.horovod.alias", *args]
    res = subprocess.run(argv, capture_output=True, text=True, env=clean_env(), cwd=cwd, timeout=30)
    timing = [line for line in res.stderr.splitlines() if line.startswith("import time:")]
    lines = [line for line in res.stderr.splitlines() if not line.startswith("import time:")]
    return res, lines, {line.rsplit("|", 1)[1].strip().split(".")[0] for line in timing}


def _files(tmp: Path) -> None:
    """The odd inputs of :data:`REFUSED`, in ``tmp``."""
    (tmp / "empty_dir").mkdir()
    (tmp / "notes.txt").write_text("Train for 3 epochs, then evaluate.\n")
    (tmp / "broken.py").write_text("import os\n\nx = (\n")
    (tmp / "weights.h5").write_bytes(b"\x89HDF\r\n\x1a\n\x00\x00\x00\x00binary")
    (tmp / "train.ipynb").write_text('{"cells": [], "metadata": {}, "nbformat": 4}\n')
    with zipfile.ZipFile(tmp / "app.zip", "w") as archive:
        archive.writestr("train.py", "print('not __main__')\n")
    (tmp / "pkg").mkdir()
    (tmp / "pkg" / "__init__.py").write_text("")
    (tmp / "badmod.py").write_text("def f(:\n")


#: (id, arguments, what the one line says): each names nothing Python can run.
REFUSED = [
    ("a-directory", ["empty_dir"], "'empty_dir' is a directory without a __main__.py"),
    ("the-current-directory", ["."], "'.' is a directory without a __main__.py"),
    ("an-absolute-directory", ["{tmp}"], "'{tmp}' is a directory without a __main__.py"),
    ("an-empty-name", [""], "the SCRIPT is '' (an unset shell variable?); give the path of a Python script"),
    ("a-text-file", ["notes.txt"], "'notes.txt' is not Python: invalid syntax at line 1"),
    ("a-syntax-error", ["broken.py", "--epochs", "3"], "'broken.py' is not Python: '(' was never closed at line 3"),
    ("a-binary-file", ["weights.h5"], "'weights.h5' is a binary file, not a Python script"),
    ("a-notebook", ["train.ipynb"], "'train.ipynb' is a Jupyter notebook, not a script: jupyter nbconvert --to script"),
    ("a-zip-without-main", ["app.zip"], "'app.zip' is a zip archive without a __main__.py"),
    ("a-package-without-main", ["-m", "pkg"], "-m 'pkg' is a package without a __main__ module"),
    ("a-module-with-a-syntax-error", ["-m", "badmod"], "-m 'badmod' ({tmp}/badmod.py) is not Python: invalid syntax"),
    ("a-built-in-module", ["-m", "sys"], "-m 'sys' is built into Python: it has no code to run"),
    ("horovod-itself", ["-m", "horovod"], "-m 'horovod' is Horovod's library"),
    ("horovodrun", ["-m", "horovod.runner.launch", "-np", "2"], "where horovodrun was used: mldist run -np N"),
    ("horovod-torch", ["-m", "horovod.torch"], "horovod.torch: mldist provides Horovod's TensorFlow and Keras"),
]


@pytest.mark.parametrize(("args", "fragment"), [pytest.param(a, f, id=i) for i, a, f in REFUSED])
def test_what_python_cannot_run_is_refused_in_one_line_with_exit_code_2(
    args: list[str], fragment: str, tmp_path: Path
) -> None:
    """A directory was an ImportError traceback, a text or binary file Python's own error through runpy."""
    _files(tmp_path)
    res, lines, imported = _alias([a.format(tmp=tmp_path) for a in args], tmp_path)
    assert res.returncode == 2 and len(lines) == 1, "\n".join(lines)[-3000:]
    assert lines[0].startswith(f"{PROG}: error: "), lines[0]
    assert fragment.format(tmp=tmp_path) in lines[0], lines[0]
    assert res.stdout == "" and not FRAMEWORKS & imported


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("dir", {"__main__.py": "import sys\nprint('RAN', sys.argv[1:])\n"}),
        ("app.pyz", {"__main__.py": "import sys\nprint('RAN', sys.argv[1:])\n"}),
        ("train", "import sys\nprint('RAN', sys.argv[1:])\n"),
    ],
    ids=["a-directory-with-main", "a-zip-with-main", "a-script-without-py"],
)
def test_what_python_runs_still_runs(name: str, body: str | dict[str, str], tmp_path: Path) -> None:
    """Python runs a folder or a zip archive with a ``__main__.py``, and a script of any name: so does the alias."""
    if isinstance(body, str):
        (tmp_path / name).write_text(body)
    elif name.endswith(".pyz"):
        with zipfile.ZipFile(tmp_path / name, "w") as archive:
            archive.writestr("__main__.py", body["__main__.py"])
    else:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__main__.py").write_text(body["__main__.py"])
    res, lines, _ = _alias([name, "--epochs", "3"], tmp_path)
    assert res.returncode == 0 and not lines, "\n".join(lines)[-3000:]
    assert res.stdout == "RAN ['--epochs', '3']\n"


#: (import line, the module the one line names): frameworks mldist does not provide, and their modules.
OTHER_FRAMEWORKS = [
    ("import horovod.torch as hvd", "horovod.torch"),
    ("import horovod.torch.elastic", "horovod.torch"),
    ("from horovod import torch", "horovod.torch"),
    ("import horovod.mxnet as hvd", "horovod.mxnet"),
    ("from horovod.spark.keras import KerasEstimator", "horovod.spark"),
    ("from horovod.ray import RayExecutor", "horovod.ray"),
]


def _missing_line(module: str) -> str:
    return (
        f"mldist: error: {module}: mldist provides Horovod's TensorFlow and Keras API only (horovod.tensorflow "
        "and its submodules, horovod.keras, horovod.tensorflow.keras, horovod.common); run this script with "
        "Horovod itself (horovodrun), or port it to horovod.tensorflow.keras"
    )


@pytest.mark.parametrize(("line", "module"), [pytest.param(li, m, id=li) for li, m in OTHER_FRAMEWORKS])
def test_another_horovod_framework_ends_the_script_with_one_line(line: str, module: str, tmp_path: Path) -> None:
    """``import horovod.torch`` was an 18-line traceback ending in mldist.errors.UnsupportedError."""
    (tmp_path / "train.py").write_text(f"import sys\nprint('STARTED', flush=True)\n{line}\nprint('AFTER')\n")
    res, lines, imported = _alias(["train.py"], tmp_path)
    assert res.returncode == 1 and lines == [_missing_line(module)], "\n".join(lines)[-3000:]
    assert res.stdout == "STARTED\n" and not FRAMEWORKS & imported


def test_another_framework_in_a_module_run_with_m_ends_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "trainer.py").write_text("import horovod.torch as hvd\n")
    res, lines, _ = _alias(["-m", "trainer"], tmp_path)
    assert res.returncode == 1 and lines == [_missing_line("horovod.torch")], "\n".join(lines)[-3000:]


def test_a_scripts_import_error_fallback_still_catches_the_refusal(tmp_path: Path) -> None:
    """Scripts that try horovod.torch and fall back (``except ImportError``, as Horovod's tests do) go on."""
    # The written script's except clauses are the subject: each class a user's fallback may name must catch
    # the refusal, and the script must go on (exit 0, one FELL BACK line each).
    fallbacks = ("ImportError", "ModuleNotFoundError", "NotImplementedError", "mldist.errors.UnsupportedError")
    body = ["import mldist.errors"]
    for kind in fallbacks:
        body += ["try:", "    import horovod.torch", f"except {kind} as exc:", f"    print('FELL BACK', {kind!r})"]
    (tmp_path / "train.py").write_text("\n".join(body) + "\n")
    res, lines, _ = _alias(["train.py"], tmp_path)
    assert res.returncode == 0 and not lines, "\n".join(lines)[-3000:]
    assert res.stdout.splitlines() == [f"FELL BACK {kind}" for kind in fallbacks]


def test_another_framework_under_mldist_run_is_one_line_per_rank(tmp_path: Path) -> None:
    """Under ``mldist run -n 2`` each rank printed the 18-line traceback; now its one line, and the launcher's."""
    (tmp_path / "train.py").write_text("import horovod.torch as hvd\nhvd.init()\n")
    cmd = ["run", "-n", "2", "--no-run-dir", "--", PY, "-m", "mldist.horovod.alias", "train.py"]
    res = mldist(cmd, timeout=60, cwd=tmp_path)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout, res.stderr[-3000:]
    ranks = [line for line in res.stderr.splitlines() if line.startswith("[")]
    assert ranks, res.stderr
    # The launcher stops the other worker when the first fails: it may not have got that far.
    assert all(line in {f"[{r}] {_missing_line('horovod.torch')}" for r in (0, 1)} for line in ranks), ranks
    assert len({line[:3] for line in ranks}) == len(ranks), ranks  # one line per rank
    assert "exited with code 1" in res.stderr
