"""Run a Horovod script unchanged: ``import horovod...`` resolves to ``mldist.horovod...``.

Usage: ``python -m mldist.horovod.alias SCRIPT [ARGS...]`` or ``-m MODULE [ARGS...]`` (under ``mldist run``,
``mpiexec`` or ``srun`` as usual), or call :func:`install` before the script's
imports. Only the TensorFlow and Keras parts of Horovod exist here:
``horovod.torch`` and friends fail with one line.

Example::

    mldist run -n 2 -- python -m mldist.horovod.alias tensorflow2_keras_mnist.py
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
from types import ModuleType
from typing import Any

from ..errors import UnsupportedError


class _HorovodAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``horovod`` and ``horovod.X`` and hands back ``mldist.horovod`` and ``mldist.horovod.X``."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "horovod" and not fullname.startswith("horovod."):
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        target = f"mldist.{spec.name}"
        try:
            return importlib.import_module(target)
        except ModuleNotFoundError as exc:
            if exc.name != target:
                raise
            raise UnsupportedError(_missing(spec.name)) from None

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the mldist module is already imported."""


#: Horovod's packages whose TensorFlow and Keras parts mldist provides.
_PROVIDED = ("horovod.tensorflow", "horovod.keras", "horovod.common")


def _missing(name: str) -> str:
    """Why ``import name`` fails: a module mldist lacks in a provided package, or another framework.

    Example:
        >>> _missing("horovod.torch")[:44]
        "horovod.torch: mldist provides Horovod's Ten"
    """
    if name.startswith(_PROVIDED):
        return f"{name}: this module of Horovod's TensorFlow API is not provided by mldist (see docs/horovod.md)"
    return (
        f"{name}: mldist provides Horovod's TensorFlow and Keras API only "
        "(horovod.tensorflow and its submodules, horovod.keras, horovod.tensorflow.keras, horovod.common)"
    )


def installed() -> bool:
    """Whether ``import horovod...`` loads mldist's modules in this process.

    By class name: ``python -m mldist.horovod.alias`` installs the class of ``__main__``.
    """
    return any(type(f).__name__ == _HorovodAlias.__name__ for f in sys.meta_path)


def install() -> None:
    """Make ``import horovod...`` load mldist's modules in this process (idempotent)."""
    if not installed():
        sys.meta_path.insert(0, _HorovodAlias())


PROG = "python -m mldist.horovod.alias"
USAGE = f"usage: {PROG} SCRIPT [ARGS...] | -m MODULE [ARGS...]"
HELP = f"""{USAGE}

Run a Horovod script unchanged: its `import horovod...` lines load mldist.horovod.
SCRIPT runs as `python SCRIPT ARGS` would (-m MODULE as `python -m MODULE ARGS`), one
process per rank, under mldist run, mpiexec or srun. Only Horovod's TensorFlow and
Keras API exists here; horovod.torch and friends fail with one line.

example:
  mldist run -n 2 -- {PROG} tensorflow2_keras_mnist.py --epochs 3
  mldist run -n 2 -- {PROG} -m pytest test_tensorflow.py   # Horovod's own tests"""


def refusal(argv: list[str], cwd: str) -> str:
    """Why ``argv`` names nothing to run, in one line; "" when it does (``--help`` is not refused here).

    Example:
        >>> refusal(["--epochs", "3"], "/")[:28], refusal(["alias.py"], os.path.dirname(__file__))
        ("'--epochs' is not an option ", '')
    """
    if not argv:
        return f"give a SCRIPT or -m MODULE to run: {USAGE}"
    if argv[0] == "-m":
        if len(argv) < 2:
            return f"-m needs a MODULE to run: {USAGE}"
        if not _module_found(argv[1], cwd):
            return f"no module named {argv[1]!r} in {cwd} or the installed packages; check its name (see --help)"
        return ""
    if argv[0].startswith("-"):
        return f"{argv[0]!r} is not an option of {PROG}: give a SCRIPT or -m MODULE first, its options after it"
    if not os.path.exists(os.path.join(cwd, argv[0])):
        return f"no script {argv[0]!r} in {cwd}; give the path of a Python script (see --help)"
    return ""


def _module_found(name: str, cwd: str) -> bool:
    sys.path.insert(0, cwd)
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or an empty name
        return False
    finally:
        sys.path.remove(cwd)


def main(argv: list[str]) -> None:
    """Run ``argv[0]`` (or, after ``-m``, a module such as pytest) as ``__main__`` with the alias installed.

    Args:
        argv: the arguments after ``python -m mldist.horovod.alias``. ``--help`` prints the usage,
            what names nothing to run ends the process with one line and exit code 2.

    Example::

        main(["train.py", "--epochs", "2"])
        main(["-m", "pytest", "test_tensorflow.py"])   # Horovod's own tests against mldist.horovod
    """
    if argv[:1] in (["-h"], ["--help"]):
        print(HELP)
        return
    install()  # first: `-m horovod.X` is found through the alias
    if problem := refusal(argv, os.getcwd()):
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        raise SystemExit(2)
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
