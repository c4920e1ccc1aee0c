"""The innermost frames of a thread, from the user's code first: what ``mldist stacks`` and a stall line show.

Read from another thread (the collective watch) through ``sys._current_frames()``, without
stopping the thread it describes. Library frames (Python's own, installed packages, mldist)
are left out but the innermost, so a rank stuck inside ``model.fit`` shows the script's line
and the library call it is in.

Example:
    >>> import sys
    >>> here = frames_of(sys._getframe())[0]
    >>> ":" in here
    True
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import threading
from pathlib import Path
from types import FrameType

#: Where library code lives: Python's, installed packages', and mldist's own.
LIBRARY = tuple(
    {
        *(
            str(Path(p).resolve()) + os.sep
            for k, p in sysconfig.get_paths().items()
            if k in ("stdlib", "purelib", "platlib")
        ),
        str(Path(__file__).resolve().parents[1]) + os.sep,
    }
)
#: How many of the user's frames a record keeps.
DEPTH = 3


def _library(filename: str) -> bool:
    return filename.startswith("<") or os.path.realpath(filename).startswith(LIBRARY)


def _short(filename: str) -> str:
    """A path as a user reads it: a library's from its package, below the working directory relative."""
    real = os.path.realpath(filename)
    for root in LIBRARY:
        if real.startswith(root):
            return real[len(root) :]
    relative = os.path.relpath(filename) if os.path.isabs(filename) else filename
    return filename if relative.startswith("..") else relative


def describe_frame(frame: FrameType) -> str:
    """``file:line function: code`` of one frame."""
    code = frame.f_code
    line = frame.f_lineno or code.co_firstlineno  # None while another thread's frame is between lines
    text = linecache.getline(code.co_filename, line).strip()
    return f"{_short(code.co_filename)}:{line} {code.co_name}" + (f": {text}" if text else "")


def frames_of(frame: FrameType | None, depth: int = DEPTH) -> tuple[str, ...]:
    """Up to ``depth`` of the user's frames, innermost first, then the innermost library frame if it is deeper.

    Args:
        frame: the innermost frame of a thread (None: no Python frames).
        depth: how many of the user's frames.
    """
    mine: list[str] = []
    innermost_library: str | None = None
    while frame is not None and len(mine) < depth:
        if not _library(frame.f_code.co_filename):
            mine.append(describe_frame(frame))
        elif not mine and innermost_library is None:
            innermost_library = describe_frame(frame)
        frame = frame.f_back
    if innermost_library is None:
        return tuple(mine)
    # Only library frames: the innermost says where; else it follows the user's, saying what they are in.
    return (*mine, f"inside {innermost_library}") if mine else (innermost_library,)


def main_thread_frames(depth: int = DEPTH) -> tuple[str, ...]:
    """The main thread's frames (see :func:`frames_of`), read from any thread."""
    main = threading.main_thread().ident
    frame = sys._current_frames().get(main) if main is not None else None
    return frames_of(frame, depth)
