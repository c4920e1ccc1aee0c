"""Whether the workers of a job formed a group: each one's note, and the launcher's line when they did not.

A script under ``mldist run -n 2`` that never joins a group (no ``mldist.init()``, an
``hvd.init()`` behind a false ``if``, Keras's ``initialize()`` without a cluster) trains one
copy per worker and exits 0: the failure users fear most, because nothing crashes. The
start-up hook of mldist's workers (:mod:`mldist.runtime.startup`) leaves a note per rank at
exit, in the job's progress folder (:func:`mldist.base.progress.folder`): how it joined, or
``alone``. The launcher reads the notes when the group ends and says one line.

Example:
    >>> line({0: "alone", 1: "alone"}, 2)[:35], line({0: "alone", 1: "alone"}, 2)[-23:]
    ('the 2 workers never formed a group ', 'each trained on its own')
    >>> line({0: "mldist.init", 1: "alone"}, 2)[:44]
    'rank 1 never joined the group of the others '
    >>> line({0: "jax.distributed", 1: "jax.distributed"}, 2)
    ''
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from pathlib import Path

from . import envvalues
from .files import atomic_write

ALONE = "alone"
#: The variable (or ``mldist run --require-group``) that makes a group never formed an error.
REQUIRE_ENV = envvalues.REQUIRE_GROUP.name
#: The start-up hook stays out of a worker when this is a no ("0", "no", "false").
HOOK_ENV = envvalues.HOOK.name
#: Set for mldist's own per-rank shims (which set up a rank, then start it): the hook is for the
#: worker they start, and each shim removes it from that worker's environment.
SKIP_ENV = envvalues.HOOK_SKIP.name
_FILE = re.compile(r"group-([0-9]{1,7})")
_HOW = re.compile(r"[a-z_.]{1,40}")
_WAYS = "mldist.init(), hvd.init() or keras.distribution.initialize()"


def hook_folder() -> Path:
    """The folder whose ``sitecustomize.py`` starts :mod:`mldist.runtime.startup` in each worker."""
    return Path(__file__).resolve().parents[1] / "runtime" / "hook"


def with_hook(env: Mapping[str, str]) -> dict[str, str]:
    """``PYTHONPATH`` with the hook's folder first (the user's entries follow); {} when switched off.

    Example:
        >>> with_hook({"PYTHONPATH": "/mine"})["PYTHONPATH"].endswith("/runtime/hook:/mine")
        True
        >>> with_hook({"MLDIST_HOOK": "0"})
        {}
    """
    if not envvalues.HOOK.read(env):
        return {}
    hook = str(hook_folder())
    rest = [p for p in env.get("PYTHONPATH", "").split(":") if p and p != hook]
    return {"PYTHONPATH": ":".join([hook, *rest])}


def required(env: Mapping[str, str]) -> bool:
    """Whether a group never formed is an error (``MLDIST_REQUIRE_GROUP`` a yes: 1, yes or true).

    Example:
        >>> required({"MLDIST_REQUIRE_GROUP": "yes"}), required({"MLDIST_REQUIRE_GROUP": "0"}), required({})
        (True, False, False)
    """
    return envvalues.REQUIRE_GROUP.read(env)


def write(where: Path, rank: int, how: str) -> None:
    """Rank ``rank``'s note: how it joined (``mldist.init``, ``jax.distributed``, ``tf.distribute``) or ``alone``."""
    with contextlib.suppress(OSError):
        where.mkdir(parents=True, exist_ok=True)
        atomic_write(where / f"group-{rank}", how + "\n")


def read(where: Path) -> dict[int, str]:
    """Every rank's note in ``where`` (ranks without one are missing: not Python, or the hook was off)."""
    notes: dict[int, str] = {}
    with contextlib.suppress(OSError):
        for path in where.iterdir():
            name = _FILE.fullmatch(path.name)
            if name is None:
                continue
            with contextlib.suppress(OSError, UnicodeDecodeError):
                how = path.read_text(encoding="utf-8").strip()
                if _HOW.fullmatch(how):
                    notes[int(name.group(1))] = how
    return notes


def clear(where: Path) -> None:
    """Remove the notes of an earlier start (a reused run directory, a restarted group)."""
    with contextlib.suppress(OSError):
        for path in where.glob("group-*"):
            path.unlink()


def line(notes: Mapping[int, str], size: int) -> str:
    """The launcher's line when ranks of a group of ``size`` noted ``alone`` ("" when none did).

    Args:
        notes: rank -> note, as :func:`read` gives.
        size: the number of workers.
    """
    alone = sorted(rank for rank, how in notes.items() if how == ALONE)
    if size < 2 or not alone:
        return ""
    if len(alone) == size:
        return f"the {size} workers never formed a group (no {_WAYS}); each trained on its own"
    ranks = ", ".join(map(str, alone))
    return f"rank{'s' if len(alone) > 1 else ''} {ranks} never joined the group of the others (no {_WAYS} there)"
