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


def main(argv: list[str]) -> None:
    """Run ``argv[0]`` (or, after ``-m``, a module such as pytest) as ``__main__`` with the alias installed.

    Example::

        main(["train.py", "--epochs", "2"])
        main(["-m", "pytest", "test_tensorflow.py"])   # Horovod's own tests against mldist.horovod
    """
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        raise SystemExit("usage: python -m mldist.horovod.alias SCRIPT [ARGS...] | -m MODULE [ARGS...]")
    install()
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
