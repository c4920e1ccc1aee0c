"""How an ``MLDIST_*`` variable's text becomes a value: :class:`Setting` and its parsers.

:mod:`mldist.base.envvalues` is the table of the launcher-worker contract, one :class:`Setting` per
variable; this module is what each entry is made of. An empty or blank value counts as unset
(``export MLDIST_PLOT=`` in a batch script). A yes/no is read one way everywhere: ``1``, ``yes``,
``true`` or ``0``, ``no``, ``false``, in any case.

Example:
    >>> Setting("MLDIST_X", 1, whole(1), "is not a count").read({"MLDIST_X": " 4 "})
    4
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..errors import ConfigError

T = TypeVar("T")
#: The words of a yes and of a no, compared after ``strip().lower()``. The start-up hook spells
#: the no words itself (it may not import mldist to read them); a test keeps the two alike.
TRUE = ("1", "yes", "true")
FALSE = ("0", "no", "false")
#: Who sets a variable: you (or your batch script), ``mldist run`` for its workers, the job script
#: ``mldist submit`` writes, or the worker itself for the processes it starts.
USER, LAUNCHER, BATCH, WORKER = "user", "launcher", "batch script", "worker"
_WHOLE = re.compile(r"[0-9]{1,12}")
_DECIMAL = re.compile(r"[0-9]{1,12}(\.[0-9]*)?|\.[0-9]+")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable: its name, its value when unset, and how its text becomes a value.

    Args:
        name: the variable.
        default: the value when it is unset or blank.
        parse: the stripped text -> the value, or None when the text is not one.
        says: what follows ``NAME='text' `` in the error: what it accepts and the fix.
        doc: what it does, one line (the environment reference of the docs).
        by: who sets it (:data:`USER`, :data:`LAUNCHER`, :data:`BATCH`, :data:`WORKER`).
        kind: the text it takes, in words ("yes/no", "seconds", "path", ...).

    Example:
        >>> Setting("MLDIST_Y", False, yes_no, "is not yes or no").read({"MLDIST_Y": " FALSE "})
        False
    """

    name: str
    default: T
    parse: Callable[[str], T | None]
    says: str
    doc: str = ""
    by: tuple[str, ...] = (USER,)
    kind: str = "text"

    def read(self, env: Mapping[str, str]) -> T:
        """The value in ``env``; ConfigError (one line) when its text is not one.

        Example:
            >>> Setting("MLDIST_Y", 0.0, seconds, "is not seconds").read({})
            0.0
        """
        raw = env.get(self.name, "")
        if not raw.strip():
            return self.default
        value = self.parse(raw.strip())
        if value is None:
            raise ConfigError(f"{self.name}={raw!r} {self.says}")
        return value


def yes_no(text: str) -> bool | None:
    """``text`` as a yes (True) or a no (False), in any case; None when it is neither.

    Example:
        >>> yes_no("TRUE"), yes_no("no"), yes_no("on")
        (True, False, None)
    """
    word = text.strip().lower()
    return True if word in TRUE else False if word in FALSE else None


def text(value: str) -> str | None:
    """Any text, as it is (a path, an id, a host list): the parser of a variable nothing refuses.

    Example:
        >>> text("/runs/a")
        '/runs/a'
    """
    return value


def whole(low: int, high: int | None = None) -> Callable[[str], int | None]:
    """A parser of decimal whole numbers from ``low`` to ``high`` (None: no upper bound).

    Example:
        >>> whole(1, 8)("4"), whole(1, 8)("9"), whole(1)("-3"), whole(1)("２")
        (4, None, None, None)
    """

    def parse(text: str) -> int | None:
        if _WHOLE.fullmatch(text) is None:
            return None
        number = int(text)
        return number if low <= number and (high is None or number <= high) else None

    return parse


def items(text: str) -> tuple[str, ...]:
    """A comma-separated list as its items, stripped, empty ones dropped: the reader checks each item
    (``mldist.placement.cluster`` names the address that is not ``host:port``).

    Example:
        >>> items("h1:20000, h2:20000,"), items(",")
        (('h1:20000', 'h2:20000'), ())
    """
    return tuple(item.strip() for item in text.split(",") if item.strip())


def seconds(text: str) -> float | None:
    """``text`` as a finite number of seconds, 0 or more (``2.5``; no sign, exponent, ``inf`` or ``nan``).

    Example:
        >>> seconds("2.5"), seconds("-1"), seconds("inf"), seconds("1_0")
        (2.5, None, None, None)
    """
    if _DECIMAL.fullmatch(text) is None:
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def flag(name: str, default: bool, on: str, off: str, doc: str, by: tuple[str, ...] = (USER,)) -> Setting[bool]:
    """A yes/no variable; ``on`` and ``off`` say what each means, for the error line.

    Example:
        >>> flag("MLDIST_X", False, "x on", "x off", "x").says[:42]
        'is not yes or no: set it to 1, yes or true'
    """
    says = f"is not yes or no: set it to 1, yes or true ({on}), or to 0, no or false ({off})"
    return Setting(name, default, yes_no, says, doc, by, "yes/no")


def given(name: str, doc: str, by: tuple[str, ...] = (LAUNCHER,), kind: str = "text") -> Setting[str | None]:
    """A variable whose text is taken as it is (None when unset): a path, an id, a list.

    Example:
        >>> given("MLDIST_Z", "z").read({"MLDIST_Z": "a,b"}), given("MLDIST_Z", "z").by
        ('a,b', ('launcher',))
    """
    return Setting(name, None, text, "", doc, by, kind)


def count(name: str, doc: str, by: tuple[str, ...] = (LAUNCHER,), low: int = 0) -> Setting[int | None]:
    """A whole number of ``low`` or more that a launcher sets (None when unset).

    Example:
        >>> count("MLDIST_N", "n").read({"MLDIST_N": "3"}), count("MLDIST_N", "n").kind
        (3, 'whole number')
    """
    return Setting(name, None, whole(low), f"is not a whole number of {low} or more", doc, by, "whole number")


def percent(text: str) -> float | None:
    """``text`` as a percentage from 0 to below 100 (``12.5``; the parser of :func:`seconds`).

    Example:
        >>> percent("10"), percent("100"), percent("-1")
        (10.0, None, None)
    """
    value = seconds(text)
    return value if value is not None and value < 100 else None


def positive_seconds(text: str) -> float | None:
    """``text`` as seconds above 0.

    Example:
        >>> positive_seconds("30"), positive_seconds("0")
        (30.0, None)
    """
    value = seconds(text)
    return value if value else None
