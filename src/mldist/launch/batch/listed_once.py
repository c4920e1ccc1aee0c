"""A staged environment's import finder for directories outside it: each is listed once, not stat-ed per import.

Standalone (the standard library only): ``--stage-env``'s unpack step copies this file into the staged
``site-packages`` as ``_mldist_listed_once.py`` with a ``.pth`` line that imports it, so it runs in every
Python of the staged environment before the script does. Python's own finder stats a ``sys.path``
directory at every import it is asked about (whether its listing changed); a script's directory, and
``PYTHONPATH`` entries, sit on the shared file system and come first, so every top-level import of a
rank cost one call there (21 to 38 in a numpy job; thousands with TensorFlow). This finder lists such
a directory once and answers "not here" from that listing; a name that is listed is found as Python
finds it. As Python documents for files made after start, ``importlib.invalidate_caches()`` makes it
look again. Directories inside the environment (and the base Python's) keep Python's finder.

Its three reads of the finder's state (``_path_mtime``, ``_path_cache``, ``_loaders``; CPython 3.10 to
3.13) fall back to Python's finder if they are missing. A run without ``--stage-env`` never has it.

Example:
    >>> import sys, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> finder = hook(folder)
    >>> finder.find_spec("surely_not_here_module") is None, type(finder).__name__
    (True, 'ListedOnce')
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import (
    BYTECODE_SUFFIXES,
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    ExtensionFileLoader,
    FileFinder,
    SourceFileLoader,
    SourcelessFileLoader,
)
from typing import Any

#: Python's own loaders, in its order (extensions, sources, bytecode).
LOADERS: list[tuple[Any, list[str]]] = [
    (ExtensionFileLoader, EXTENSION_SUFFIXES),
    (SourceFileLoader, SOURCE_SUFFIXES),
    (SourcelessFileLoader, BYTECODE_SUFFIXES),
]


class ListedOnce(FileFinder):
    """Python's finder, but a name absent from the directory's listing is absent without a stat."""

    def find_spec(self, fullname: str, target: Any = None) -> Any:
        """None at once for a name the listing does not hold; else Python's answer."""
        try:
            listed = self._path_mtime != -1  # type: ignore[attr-defined]
            names = self._path_cache  # type: ignore[attr-defined]
            suffixes = [suffix for suffix, _ in self._loaders]  # type: ignore[attr-defined]
        except AttributeError:
            return super().find_spec(fullname, target)
        tail = fullname.rpartition(".")[2]
        if listed and tail not in names and not any(tail + s in names for s in suffixes):
            return None
        return super().find_spec(fullname, target)


_KEEP = tuple(os.path.join(p, "") for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
_MAKE = ListedOnce.path_hook(*LOADERS)


def hook(path: str) -> Any:
    """``sys.path_hooks``' entry: a :class:`ListedOnce` for a directory outside this Python's own ones."""
    if os.path.join(os.path.abspath(path or os.curdir), "").startswith(_KEEP):
        raise ImportError("inside the environment: Python's own finder")
    return _MAKE(path)


def install() -> None:
    """Put :func:`hook` first in ``sys.path_hooks`` (once)."""
    if hook not in sys.path_hooks:
        sys.path_hooks.insert(0, hook)


if __name__ == "_mldist_listed_once":  # the staged copy, imported by its .pth line
    install()
