"""Reading the files a run left as untrusted: a checked value, or one line that names the file and why.

``mldist status``, ``stacks`` and ``logs`` read what runs and jobs wrote: config.json, summary.json,
training.json, job records. On a shared file system such a file may be another user's (a 0700 folder,
a 0600 file), cut short by a full disk or a crash, edited by hand, or written by another version. A
reader turns each into a value or an :class:`Unusable` error whose one line names the file and the
reason; it never guesses (a file it cannot read is never taken for a missing one) and never lets a
wrong type or an absurd number (a pid of 2**40, a time of 1e300, NaN) through to the code that
formats it. :func:`load` reads a JSON object, :func:`check` holds it to a table of fields.

Example:
    >>> FIELDS = {"pid": PID, "signals": list_of(TEXT)}
    >>> check({"pid": 7, "signals": ["SIGTERM"]}, FIELDS, "summary.json")["pid"]
    7
    >>> try:
    ...     check({"signals": 15}, FIELDS, "summary.json")
    ... except Unusable as exc:
    ...     print(exc)
    summary.json is damaged: "signals" is 15, not a list of text
"""

from __future__ import annotations

import datetime
import json
import math
import os
import pwd
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError

#: The largest JSON file a reader takes (a record is a few kB; a larger one is not ours).
MOST_BYTES = 16 << 20


class Unusable(ConfigError):
    """A file that is there but cannot be used: unreadable, not JSON, or of the wrong shape.

    Args:
        path: the file.
        reason: why, in words that follow the path (``cannot be read (...)``, ``is damaged: ...``).
    """

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"{path} {reason}")
        self.path, self.reason = str(path), reason


@dataclass(frozen=True)
class Kind:
    """What a field may hold: its description (``a whole number from 0 to 255``) and the test.

    ``parts`` of a list or an object: its items as (name suffix, value, kind), so that the line names the
    innermost value at fault (``"metrics.loss"``, ``"exit_codes[1]"``).
    """

    what: str
    ok: Callable[[Any], bool]
    parts: Callable[[Any], list[tuple[str, Any, Kind]]] = lambda v: []


def _real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def whole(low: int, high: int) -> Kind:
    """A whole number from ``low`` to ``high`` (a bool is not one).

    Example:
        >>> whole(0, 9).ok(3), whole(0, 9).ok(True), whole(0, 9).ok(10)
        (True, False, False)
    """
    return Kind(f"a whole number from {low} to {high}", lambda v: type(v) is int and low <= v <= high)


def number(low: float, high: float, what: str = "") -> Kind:
    """A finite number from ``low`` to ``high`` (JSON's NaN and Infinity are not).

    Example:
        >>> number(0, 1).ok(0.5), number(0, 1).ok(float("nan")), number(0, 1).ok("0.5")
        (True, False, False)
    """
    what = what or f"a number from {low:g} to {high:g}"
    return Kind(what, lambda v: _real(v) and math.isfinite(v) and low <= v <= high)


def optional(kind: Kind) -> Kind:
    """``kind``, or null."""
    return Kind(f"{kind.what} or null", lambda v: v is None or kind.ok(v))


def list_of(kind: Kind) -> Kind:
    """A list of ``kind``."""
    return Kind(
        f"a list of {kind.what}",
        lambda v: isinstance(v, list) and all(map(kind.ok, v)),
        lambda v: [(f"[{i}]", item, kind) for i, item in enumerate(v)] if isinstance(v, list) else [],
    )


def map_of(kind: Kind) -> Kind:
    """An object whose every value is ``kind``."""
    return Kind(
        f"an object of {kind.what}",
        lambda v: isinstance(v, dict) and all(map(kind.ok, v.values())),
        lambda v: [(f".{k}", item, kind) for k, item in v.items()] if isinstance(v, dict) else [],
    )


def fields_of(fields: Mapping[str, Kind]) -> Kind:
    """An object whose fields in ``fields`` (null or missing: not there) are of their kinds.

    Example:
        >>> fields_of({"pid": PID}).ok({"pid": 2**40}), fields_of({"pid": PID}).ok({"name": "x"})
        (False, True)
    """
    return Kind(
        "an object",
        lambda v: isinstance(v, dict) and all(v.get(k) is None or c.ok(v[k]) for k, c in fields.items()),
        lambda v: (
            [(f".{k}", v[k], c) for k, c in fields.items() if v.get(k) is not None] if isinstance(v, dict) else []
        ),
    )


def either(*kinds: Kind) -> Kind:
    """Any one of ``kinds``."""
    return Kind(" or ".join(k.what for k in kinds), lambda v: any(k.ok(v) for k in kinds))


def _iso(value: Any) -> bool:
    try:
        datetime.datetime.fromisoformat(value).timestamp()  # its year may be 1 or 9999: both must work
        return True
    except (TypeError, ValueError, OverflowError):
        return False


TEXT = Kind("text", lambda v: isinstance(v, str))
#: A metric's value: any number, NaN and infinities included (a diverged loss is one).
METRIC = Kind("a number", _real)
FLAG = Kind("true or false", lambda v: isinstance(v, bool))
#: A process id (Linux's pid_max is at most 2**22; a pid_t is 32 bits).
PID = whole(0, 2**31 - 1)
#: An exit code as a shell shows it, or a launcher's own (0-255, 128+N for signal N).
CODE = whole(-255, 65535)
COUNT = whole(0, 2**31 - 1)
#: Seconds since the epoch, up to the year 9999 (time.localtime's range everywhere).
UNIX_TIME = number(0, 253402300799, "a time in seconds since 1970 (before the year 10000)")
#: A duration or a rate: finite, not negative.
AMOUNT = number(0, 1e15)
#: An ISO time of the records (``2026-11-24T01:02:03+00:00``).
ISO_TIME = Kind("an ISO time", _iso)


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check(data: Mapping[str, Any], fields: Mapping[str, Kind], path: str | os.PathLike[str]) -> dict[str, Any]:
    """``data`` if each of ``fields`` it holds (null or missing: not there) is of its kind, else Unusable.

    Fields not in the table pass unchecked: readers never use them.

    Args:
        data: the file's object.
        fields: name -> kind.
        path: the file, for the line.
    """
    for name, kind in fields.items():
        value = data.get(name)
        if value is not None and (fault := _fault(name, value, kind)):
            raise Unusable(path, f"is damaged: {fault}")
    return dict(data)


def _fault(name: str, value: Any, kind: Kind) -> str:
    """'' when ``value`` is of ``kind``, else the words for its innermost part at fault."""
    if kind.ok(value):
        return ""
    for suffix, part, inner in kind.parts(value):
        if found := _fault(name + suffix, part, inner):
            return found
    return f'"{name}" is {_shown(value)}, not {kind.what}'


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def denied(path: str | os.PathLike[str]) -> str:
    """Why ``path`` cannot be read, as far as can be told: whose the file (or the folder that shuts it) is, its mode.

    Example:
        >>> denied("/")
        "permission denied (/ is root's, mode 0755)"
    """
    where = Path(path)
    for folder in [*reversed(where.parents), where]:  # the outermost folder this user may not enter
        if folder.is_dir() and not os.access(folder, os.R_OK | os.X_OK):
            where = folder
            break
    try:
        info = where.stat()
    except OSError:
        return "permission denied"
    return f"permission denied ({where} is {_owner(info.st_uid)}'s, mode {stat.S_IMODE(info.st_mode):04o})"


def read_text(path: str | os.PathLike[str], most: int = MOST_BYTES) -> str | None:
    """The text of ``path``; None when there is no such file; Unusable when it is there but cannot be read.

    Example:
        >>> read_text("/nonexistent/config.json") is None
        True
    """
    try:
        with open(path, "rb") as fh:
            raw = fh.read(most + 1)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        raise Unusable(path, f"cannot be read: {denied(path)}") from None
    except OSError as exc:
        raise Unusable(path, f"cannot be read ({exc.strerror or exc})") from None
    if len(raw) > most:
        raise Unusable(path, f"is damaged: larger than {most >> 20} MB, not a record of mldist")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Unusable(path, "is damaged: not UTF-8 text") from None


def load(path: str | os.PathLike[str], fields: Mapping[str, Kind] | None = None) -> dict[str, Any] | None:
    """The JSON object in ``path``, checked against ``fields``; None when there is no file; else Unusable.

    Args:
        path: the file.
        fields: the table :func:`check` holds the object to (None: any object).

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix=".json") as fh:
        ...     _ = fh.write('{"pid": 1'); fh.flush()
        ...     try:
        ...         load(fh.name)
        ...     except Unusable as exc:
        ...         print(exc.reason)
        is damaged: not JSON (cut short, or written over?)
    """
    text = read_text(path)
    if text is None:
        return None
    try:
        data = json.loads(text)  # NaN stays: a diverged loss is one; number() refuses it elsewhere
    except (ValueError, RecursionError):
        raise Unusable(path, "is damaged: not JSON (cut short, or written over?)") from None
    if not isinstance(data, dict):
        raise Unusable(path, f"is damaged: not a JSON object but {type(data).__name__}")
    return check(data, fields or {}, path)


def readable_dir(path: str | os.PathLike[str]) -> str:
    """ "" when folder ``path`` can be listed and entered, else the reason (see :func:`denied`).

    Example:
        >>> readable_dir("/")
        ''
    """
    if os.access(path, os.R_OK | os.X_OK):
        return ""
    return f"cannot be read: {denied(path)}"
