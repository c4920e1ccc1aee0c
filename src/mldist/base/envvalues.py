"""The values of mldist's own environment variables: each read one way, a bad one refused in one line.

Every ``MLDIST_*`` value that the launcher, the start-up hook and the workers read as a yes/no,
a count or seconds is one :class:`Setting` here: its name, its default, its parser and what it
accepts. ``Setting.read`` gives the value; a value the parser refuses raises one
:class:`~mldist.errors.ConfigError` line that names the variable, the value and the fix. An
empty or blank value counts as unset (``export MLDIST_PLOT=`` in a batch script). A yes/no is
read one way everywhere: ``1``, ``yes``, ``true`` or ``0``, ``no``, ``false``, in any case.

:data:`WORKER_SETTINGS` lists the ones the workers read, so that ``mldist run`` can refuse a bad
one before it starts any worker (:func:`check`), ``mldist.init()`` in a worker started some other
way (a bare ``mpirun``, ``srun``) refuses it before any side effect, and ``mldist env`` names it.
This module is the seed of one table of the launcher-worker contract: the other ``MLDIST_*``
names (ranks, run directory, engine) are still spelled where they are read.

Example:
    >>> REQUIRE_GROUP.read({"MLDIST_REQUIRE_GROUP": "Yes"}), PLOT.read({}), COLLECTIVE_TIMEOUT.read({})
    (True, True, 600.0)
    >>> problems({"MLDIST_PORT_BASE": "70000"})
    ["MLDIST_PORT_BASE='70000' is not a port from 1024 to 53535: set it to one (default 20000), or unset it"]
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..errors import ConfigError

T = TypeVar("T")
#: The words of a yes and of a no, compared after ``strip().lower()``. The start-up hook spells
#: the no words itself (it may not import mldist to read them); a test keeps the two alike.
TRUE = ("1", "yes", "true")
FALSE = ("0", "no", "false")
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
    """

    name: str
    default: T
    parse: Callable[[str], T | None]
    says: str

    def read(self, env: Mapping[str, str]) -> T:
        """The value in ``env``; ConfigError (one line) when its text is not one.

        Example:
            >>> GLOO_IDLE.read({"MLDIST_GLOO_IDLE": " FALSE "})
            False
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


def flag(name: str, default: bool, on: str, off: str) -> Setting[bool]:
    """A yes/no variable; ``on`` and ``off`` say what each means, for the error line.

    Example:
        >>> flag("MLDIST_X", False, "x on", "x off").says[:42]
        'is not yes or no: set it to 1, yes or true'
    """
    says = f"is not yes or no: set it to 1, yes or true ({on}), or to 0, no or false ({off})"
    return Setting(name, default, yes_no, says)


#: ``RunLog`` draws metrics.png on rank 0 when the script does not say (matplotlib: about a second).
PLOT = flag("MLDIST_PLOT", True, "RunLog draws metrics.png", "no plot")
#: A group never formed fails the run (``mldist run --require-group``).
REQUIRE_GROUP = flag("MLDIST_REQUIRE_GROUP", False, "a run whose workers never formed a group fails", "it is a note")
#: The start-up hook in the workers (:mod:`mldist.runtime.hook`).
HOOK = flag("MLDIST_HOOK", True, "the start-up hook runs in the workers", "no hook")
#: Each worker gets ``TF_CONFIG`` (``mldist run --tf-config``).
TF_CONFIG = flag("MLDIST_TF_CONFIG", False, "each worker gets TF_CONFIG", "no TF_CONFIG")
#: mldist moves JAX's Gloo event-loop thread to ``SCHED_IDLE``.
GLOO_IDLE = flag("MLDIST_GLOO_IDLE", True, "Gloo's loop thread runs at idle priority", "left at normal priority")
#: The remote shim of ``mldist run -H`` passes TensorFlow's start-up notices on (``--verbose``).
VERBOSE = flag("MLDIST_VERBOSE", False, "start-up notices shown", "hidden")

#: Seconds a collective may take before the stalled-collective watch ends the job (0: no watch).
COLLECTIVE_TIMEOUT: Setting[float] = Setting(
    "MLDIST_COLLECTIVE_TIMEOUT",
    600.0,
    seconds,
    "is not a number of seconds: set it to e.g. 600 (the default), or 0 to turn the stalled-collective watch off",
)
#: Ports are handed out from [base, base + PORT_SPAN), below Linux's ephemeral range (32768).
PORT_SPAN = 12000
DEFAULT_PORT_BASE = 20000
#: The first port of the range mldist hands out.
PORT_BASE: Setting[int] = Setting(
    "MLDIST_PORT_BASE",
    DEFAULT_PORT_BASE,
    whole(1024, 65535 - PORT_SPAN),
    f"is not a port from 1024 to {65535 - PORT_SPAN}: set it to one (default {DEFAULT_PORT_BASE}), or unset it",
)
#: The CPUs this rank owns, when no affinity mask or ``SLURM_CPUS_PER_TASK`` says so.
CPUS_PER_TASK: Setting[int | None] = Setting(
    "MLDIST_CPUS_PER_TASK",
    None,
    whole(1),
    "is not a CPU count: set it to a whole number of 1 or more (e.g. 4), or unset it to use this rank's CPUs",
)


def _thread_count(name: str) -> Setting[int | None]:
    says = (
        f"is not a thread count: give a whole number of 1 or more (e.g. {name}=4), "
        "or leave it unset for the plan from this rank's CPUs"
    )
    return Setting(name, None, whole(1), says)


#: TensorFlow's thread pools, over the plan from the CPUs (an ``init`` argument wins over them).
INTRA_OP = _thread_count("MLDIST_INTRA_OP")
INTER_OP = _thread_count("MLDIST_INTER_OP")

#: What the workers (and their start-up hook) read: checked before ``mldist run`` starts one, and by
#: ``mldist.init()`` before any side effect.
WORKER_SETTINGS: tuple[Setting[Any], ...] = (
    COLLECTIVE_TIMEOUT,
    PORT_BASE,
    CPUS_PER_TASK,
    INTRA_OP,
    INTER_OP,
    REQUIRE_GROUP,
    PLOT,
    HOOK,
    TF_CONFIG,
    GLOO_IDLE,
    VERBOSE,
)


def problems(env: Mapping[str, str]) -> list[str]:
    """The error line of each variable of :data:`WORKER_SETTINGS` whose value in ``env`` is refused.

    Example:
        >>> problems({"MLDIST_REQUIRE_GROUP": "maybe"})[0][:47]
        "MLDIST_REQUIRE_GROUP='maybe' is not yes or no: "
        >>> problems({"MLDIST_REQUIRE_GROUP": "yes", "MLDIST_COLLECTIVE_TIMEOUT": "0"})
        []
    """
    found = []
    for setting in WORKER_SETTINGS:
        try:
            setting.read(env)
        except ConfigError as exc:
            found.append(str(exc))
    return found


def check(env: Mapping[str, str]) -> None:
    """Raise the first of :func:`problems` (one line), if any: the decision ``mldist run`` and ``init`` share.

    Example:
        >>> check({"MLDIST_PLOT": "0", "MLDIST_HOOK": "No"})
    """
    found = problems(env)
    if found:
        raise ConfigError(found[0])
