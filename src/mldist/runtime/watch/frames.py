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

import ast
import dis
import functools
import inspect
import linecache
import os
import sys
import sysconfig
import threading
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

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


def main_thread_frame() -> FrameType | None:
    """The main thread's innermost frame, read from any thread (None: no Python frames)."""
    main = threading.main_thread().ident
    return sys._current_frames().get(main) if main is not None else None


def main_thread_frames(depth: int = DEPTH) -> tuple[str, ...]:
    """The main thread's frames (see :func:`frames_of`), read from any thread."""
    return frames_of(main_thread_frame(), depth)


#: The instructions that call (Python 3.10 to 3.13).
_CALLS = frozenset({"CALL", "CALL_KW", "CALL_FUNCTION", "CALL_FUNCTION_KW", "CALL_FUNCTION_EX", "CALL_METHOD"})


@functools.lru_cache(maxsize=256)
def _calls(code: CodeType) -> dict[int, Any]:
    """The call instructions of ``code`` with a place in the source (Python 3.11+): offset -> positions."""
    found = {i.offset: getattr(i, "positions", None) for i in dis.get_instructions(code) if i.opname in _CALLS}
    return {offset: where for offset, where in found.items() if where is not None and None not in tuple(where)}


@functools.lru_cache(maxsize=512)
def _call_at(code: CodeType, offset: int) -> tuple[ast.expr, tuple[ast.expr, ...]] | None:
    """(callee, arguments) as written, of the call instruction at ``offset`` of ``code``; None if it is none."""
    where = _calls(code).get(offset)
    if where is None:
        return None
    lines = [line.encode() for line in linecache.getlines(code.co_filename)[where.lineno - 1 : where.end_lineno]]
    if len(lines) != where.end_lineno - where.lineno + 1:
        return None  # no source (python -c, a changed file)
    lines[-1] = lines[-1][: where.end_col_offset]
    lines[0] = lines[0][where.col_offset :]
    try:
        node = ast.parse(b"(" + b"".join(lines) + b"\n)", mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(node, ast.Call):
        return None
    return node.func, (*node.args, *(k.value for k in node.keywords))


def _read(node: ast.expr, scopes: tuple[dict[str, Any], ...]) -> Any:
    """The value of a name or attribute chain, without running the program's code (no properties)."""
    if isinstance(node, ast.Name):
        for scope in scopes:
            if node.id in scope:
                return scope[node.id]
        raise LookupError(node.id)
    if isinstance(node, ast.Attribute):
        return inspect.getattr_static(_read(node.value, scopes), node.attr)
    if isinstance(node, ast.Starred):
        return _read(node.value, scopes)
    raise LookupError(ast.dump(node))


def calling(frame: FrameType) -> tuple[Any, list[Any]] | None:
    """What ``frame`` is calling now and the arguments that are names or attributes: a C function's caller.

    Read from the source (Python 3.11+; None on 3.10, without source, or between calls): a
    thread waiting in C code has no frame of its own, so its callee is read from the caller's
    line. Nothing of the program runs: names are looked up, attributes read statically.

    Args:
        frame: a frame of another thread, paused in a call.

    Example:
        >>> import threading, time
        >>> caught = []
        >>> def peek():  # reads the main thread, as the stall watch does
        ...     time.sleep(0.2)
        ...     caught.append(calling(main_thread_frame()))
        >>> pause = 1.0
        >>> threading.Thread(target=peek).start(); time.sleep(pause)
        >>> caught[0][0] is time.sleep, caught[0][1]
        (True, [1.0])
    """
    found = _call_at(frame.f_code, frame.f_lasti)
    if found is None:
        return None
    scopes = (frame.f_locals, frame.f_globals, frame.f_builtins)
    try:
        callee = _read(found[0], scopes)
    except (LookupError, AttributeError):
        return None
    args = []
    for node in found[1]:
        try:
            args.append(_read(node, scopes))
        except (LookupError, AttributeError):
            continue  # an expression (a call, a literal): not read
    return callee, args
