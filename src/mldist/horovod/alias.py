"""Run a Horovod script unchanged: ``import horovod...`` resolves to ``mldist.horovod...``.

Usage: ``python -m mldist.horovod.alias SCRIPT [ARGS...]`` or ``-m MODULE [ARGS...]`` (under ``mldist run``,
``mpiexec`` or srun as usual), or call :func:`install` before the script's imports. SCRIPT is what
``python SCRIPT`` runs: a Python file of any name, or a folder or zip archive with a ``__main__.py``;
what names nothing of the kind ends the process with one line and exit code 2. Only the TensorFlow
and Keras parts of Horovod exist here: ``import horovod.torch`` and friends raise
:class:`mldist.horovod.RefusedModule` (an ImportError, so a script's fallback still takes it), and a script that
does not catch it ends with one line and exit code 1.

Example::

    mldist run -n 2 -- python -m mldist.horovod.alias tensorflow2_keras_mnist.py
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import pkgutil
import runpy
import shlex
import sys
from types import ModuleType
from typing import Any

from ..base import processwide
from ..runtime.start import patches
from ..runtime.watch import failures
from . import RefusedModule


class _HorovodAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``horovod`` and ``horovod.X`` and hands back ``mldist.horovod`` and ``mldist.horovod.X``.

    It also claims ``mldist.horovod.torch`` and the other frameworks of :data:`_OTHERS`, which
    ``from horovod import torch`` imports by that name, to refuse them alike.
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "horovod" or fullname.startswith("horovod."):
            return importlib.util.spec_from_loader(fullname, self)
        parent, _, top = fullname.rpartition(".")
        if parent != "mldist.horovod" or top not in _OTHERS:
            return None
        if importlib.machinery.PathFinder.find_spec(fullname, path) is not None:  # one that mldist adds one day
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        if spec.name.startswith("mldist."):  # one of _OTHERS, by mldist's name
            raise RefusedModule(_missing(spec.name.removeprefix("mldist.")))
        target = f"mldist.{spec.name}"
        try:
            return importlib.import_module(target)
        except ModuleNotFoundError as exc:
            if exc.name != target:
                raise
            raise RefusedModule(_missing(spec.name)) from None

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the mldist module is already imported."""


#: Horovod's packages whose TensorFlow and Keras parts mldist provides.
_PROVIDED = ("horovod.tensorflow", "horovod.keras", "horovod.common")
#: Horovod 0.28's other top-level packages (frameworks and their shared data loaders), none provided.
_OTHERS = ("torch", "mxnet", "spark", "ray", "data")


def _missing(name: str) -> str:
    """Why ``import name`` fails: a module mldist lacks in a provided package, or another framework.

    Args:
        name: the Horovod module, e.g. ``horovod.torch`` (its submodules are named by the package).

    Example:
        >>> _missing("horovod.torch")[:44]
        "horovod.torch: mldist provides Horovod's Ten"
    """
    if name.startswith(_PROVIDED):
        return f"{name}: this module of Horovod's TensorFlow API is not provided by mldist (see docs/horovod.md)"
    return (
        f"{name}: mldist provides Horovod's TensorFlow and Keras API only "
        "(horovod.tensorflow and its submodules, horovod.keras, horovod.tensorflow.keras, horovod.common); "
        "run this script with Horovod itself (horovodrun), or port it to horovod.tensorflow.keras"
    )


def installed() -> bool:
    """Whether ``import horovod...`` loads mldist's modules in this process.

    By class name: ``python -m mldist.horovod.alias`` installs the class of ``__main__``.
    """
    return any(type(f).__name__ == _HorovodAlias.__name__ for f in sys.meta_path)


def install() -> None:
    """Make ``import horovod...`` load mldist's modules in this process (idempotent), and Keras 3's optimizers
    answer Keras 2's ``opt.variables()`` as Horovod's TF2 examples call it
    (:func:`mldist.runtime.start.patches.keras2_variables`: when the script imports Keras)."""
    if not installed():
        processwide.import_hook("sys.meta_path: horovod", _HorovodAlias())
    patches.keras2_variables()


PROG = "python -m mldist.horovod.alias"
USAGE = f"usage: {PROG} SCRIPT [ARGS...] | -m MODULE [ARGS...]"
HELP = f"""{USAGE}

Run a Horovod script unchanged: its `import horovod...` lines load mldist.horovod.
SCRIPT runs as `python SCRIPT ARGS` would (-m MODULE as `python -m MODULE ARGS`), one
process per rank, under mldist run, mpiexec or srun: a Python file of any name, or a
folder or zip archive with a __main__.py. Only Horovod's TensorFlow and Keras API exists
here; horovod.torch and friends fail with one line (an ImportError to the script).

example:
  mldist run -n 2 -- {PROG} tensorflow2_keras_mnist.py --epochs 3
  mldist run -n 2 -- {PROG} -m pytest test_tensorflow.py   # Horovod's own tests"""


def refusal(argv: list[str], cwd: str) -> str:
    """Why ``argv`` names nothing to run, in one line; "" when it does (``--help`` is not refused here).

    Python would refuse it too, or fail before the script's first line, with a traceback through runpy.

    Args:
        argv: the arguments after ``python -m mldist.horovod.alias``.
        cwd: the directory that relative names are in.

    Example:
        >>> refusal(["--epochs", "3"], "/")[:28], refusal(["alias.py"], os.path.dirname(__file__))
        ("'--epochs' is not an option ", '')
    """
    if not argv:
        return f"give a SCRIPT or -m MODULE to run: {USAGE}"
    if argv[0] == "-m":
        if len(argv) < 2:
            return f"-m needs a MODULE to run: {USAGE}"
        return _module_refusal(argv[1], cwd)
    if argv[0].startswith("-"):
        return f"{argv[0]!r} is not an option of {PROG}: give a SCRIPT or -m MODULE first, its options after it"
    return _script_refusal(argv[0], cwd)


def _script_refusal(script: str, cwd: str) -> str:
    """Why ``python SCRIPT`` would run nothing, or fail before the script's first line; "" when it runs.

    Example:
        >>> _script_refusal(".", os.path.dirname(__file__))[:38]
        "'.' is a directory without a __main__."
    """
    if not script:
        return "the SCRIPT is '' (an unset shell variable?); give the path of a Python script (see --help)"
    path = os.path.join(cwd, script)
    if not os.path.exists(path):
        return f"no script {script!r} in {cwd}; give the path of a Python script (see --help)"
    if script.endswith(".ipynb"):
        return (
            f"{script!r} is a Jupyter notebook, not a script: jupyter nbconvert --to script "
            f"{shlex.quote(script)} writes one to give here"
        )
    importer = pkgutil.get_importer(path)  # as runpy.run_path: a folder or a zip archive runs its __main__
    if importer is not None:
        kind = "directory" if os.path.isdir(path) else "zip archive"
        main = importer.find_spec("__main__")
        if main is None:
            return (
                f"{script!r} is a {kind} without a __main__.py, so Python runs nothing there; "
                "give the Python script to run (see --help)"
            )
        return _not_python(f"{script!r}", main.origin or "", "script")
    return _not_python(f"{script!r}", path, "script")


def _module_refusal(name: str, cwd: str) -> str:
    """Why ``python -m NAME`` would run nothing, or fail before the module's first line; "" when it runs.

    Example:
        >>> _module_refusal("json", "/")[:42], _module_refusal("json.tool", "/")
        ("-m 'json' is a package without a __main__ ", '')
    """
    if name == "horovod" or name.startswith("horovod."):
        if name.startswith("horovod.runner"):
            return f"-m {name!r} is horovodrun; where horovodrun was used: mldist run -np N -- {PROG} SCRIPT"
        if name == "horovod" or name.startswith(_PROVIDED):
            return f"-m {name!r} is Horovod's library, not a program; give the SCRIPT or -m MODULE that uses it"
        return _missing(".".join(name.split(".")[:2]))
    spec = _module_spec(name, cwd)
    if spec is None:
        return f"no module named {name!r} in {cwd} or the installed packages; check its name (see --help)"
    if spec.origin == "built-in":
        return f"-m {name!r} is built into Python: it has no code to run; give the SCRIPT or -m MODULE to run"
    if spec.submodule_search_locations is not None:  # a package: Python runs its __main__
        spec = importlib.machinery.PathFinder.find_spec(f"{name}.__main__", list(spec.submodule_search_locations))
        if spec is None:
            return f"-m {name!r} is a package without a __main__ module; give the module to run: -m {name}.MODULE"
    return _not_python(f"-m {name!r} ({spec.origin})", spec.origin or "", "module")


def _module_spec(name: str, cwd: str) -> importlib.machinery.ModuleSpec | None:
    """Where ``python -m NAME`` in ``cwd`` finds NAME (its parents imported, as Python does); None when not."""
    sys.path.insert(0, cwd)
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError as exc:  # NAME or a parent missing; another module a parent imports fails as Python's
        if exc.name and f"{name}.".startswith(f"{exc.name}."):
            return None
        raise
    except ValueError:  # an empty or relative name
        return None
    finally:
        sys.path.remove(cwd)


def _not_python(shown: str, path: str, what: str) -> str:
    """Why the file at ``path`` cannot run as Python, in one line that starts with ``shown``; "" when it compiles.

    Args:
        shown: the argument as the user gave it.
        path: the file; "" or a path into a zip archive is not checked.
        what: "script" or "module", for the fix.

    Example:
        >>> _not_python("'alias.py'", __file__, "script")
        ''
    """
    if not os.path.isfile(path):  # inside a zip archive, a pipe such as /dev/stdin: as Python reads it
        return ""
    try:
        with open(path, "rb") as file:
            source = file.read()
    except OSError as exc:
        return f"cannot read {shown}: {exc.strerror}; give a {what} you may read (see --help)"
    if source.startswith(importlib.util.MAGIC_NUMBER):  # this Python's bytecode, which Python runs too
        return ""
    if b"\0" in source:
        return f"{shown} is a binary file, not a Python {what}; give the {what} to run (see --help)"
    try:
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"{shown} is not Python: {exc.msg} at line {exc.lineno}; fix that line, or give the {what} to run"
    return ""


def main(argv: list[str]) -> None:
    """Run ``argv[0]`` (or, after ``-m``, a module such as pytest) as ``__main__`` with the alias installed.

    Args:
        argv: the arguments after ``python -m mldist.horovod.alias``. ``--help`` prints the usage,
            what names nothing to run ends the process with one line and exit code 2, and a
            :class:`~mldist.horovod.RefusedModule` the script does not catch (``import horovod.torch``)
            with one line (naming the rank after ``init``) and exit code 1.

    Example::

        main(["train.py", "--epochs", "2"])
        main(["-m", "pytest", "test_tensorflow.py"])   # Horovod's own tests against mldist.horovod
    """
    if argv[:1] in (["-h"], ["--help"]):
        print(HELP)
        return
    install()  # first: a package that -m MODULE names may import horovod
    try:
        if problem := refusal(argv, os.getcwd()):
            print(f"{PROG}: error: {problem}", file=sys.stderr)
            raise SystemExit(2)
        _run(argv)
    except RefusedModule as exc:
        # As mldist.init()'s sys.excepthook prints it; before init nothing would, and Python prints a traceback.
        failures.one_line_errors(type(exc), exc, exc.__traceback__)
        raise SystemExit(1) from None


def _run(argv: list[str]) -> None:
    """Run what :func:`refusal` accepted, as ``python ARGV`` would."""
    if argv[0] == "-m":
        # As `python -m MODULE` does: the current directory first; argv[0] becomes the module's path.
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    sys.argv = list(argv)
    # As `python SCRIPT` does: the script's own directory first, so its sibling modules import.
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
