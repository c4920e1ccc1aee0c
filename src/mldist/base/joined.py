"""Whether the workers of a job formed a group: each one's note, and the launcher's line when they did not.

A script under ``mldist run -n 2`` that never joins a group (no ``mldist.init()``, an
``hvd.init()`` behind a false ``if``, Keras's ``initialize()`` without a cluster) trains one
copy per worker and exits 0: the failure users fear most, because nothing crashes. The
start-up hook of mldist's workers (:mod:`mldist.runtime.start.startup`) leaves a note per rank at
exit, in the job's progress folder (:func:`mldist.base.progress.folder`): how it joined, or
``alone``. The launcher reads the notes when the group ends and says one line.

A group that half forms (some ranks join, the others finish without joining) would wait for ever:
MPI's start-up and JAX's wait for every rank. A rank about to join marks it first (:func:`mark`,
``group-R.joining``: the launch and the user's line), before that start-up; a rank that finishes
alone notes it first. Each then looks for the other: the joining rank that finds an ``alone`` note,
or the rank finishing alone that finds a joining rank still there, ends the job with one line
(:func:`half_formed`). Both write before they read, so one of them always sees the other.

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
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from . import envvalues, progress

ALONE = "alone"
#: The note of a rank that did not join because an uncaught error ended it (its own line says which): not
#: a script that never joins, so the ranks that wait for it are told that, not "no mldist.init()".
FAILED = "failed"
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
    """The folder whose ``sitecustomize.py`` starts :mod:`mldist.runtime.start.startup` in each worker."""
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


def write(where: Path, rank: int, how: str, launch: str = "") -> None:
    """Rank ``rank``'s note: how it joined (``mldist.init``, ``jax.distributed``, ``tf.distribute``) or ``alone``;
    ``launch`` (:func:`launch_key`), on a second line, tells it from an earlier launch's in the same folder.

    A rank that did not join (``alone``, ``failed``) also adds a line to ``group-ends``, the one file a joining
    rank reads (:func:`ended`): no rank lists the folder."""
    _put(where / f"group-{rank}", how + "\n" + (launch + "\n" if launch else ""))
    if how in (ALONE, FAILED):
        _append(where / ENDS, f"{rank}\t{how}\t{launch}\n")


def _lines(path: Path) -> list[str]:
    """A note's lines (none when it cannot be read)."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return []


def read(where: Path, launch: str | None = None) -> dict[int, str]:
    """Every rank's note in ``where`` (ranks without one are missing: not Python, or the hook was off);
    with ``launch``, only the notes of that launch."""
    notes: dict[int, str] = {}
    with contextlib.suppress(OSError):
        for path in where.iterdir():
            name = _FILE.fullmatch(path.name)
            if name is None:
                continue
            lines = _lines(path)
            if lines and _HOW.fullmatch(lines[0]) and (launch is None or lines[1:2] == [launch]):
                notes[int(name.group(1))] = lines[0]
    return notes


def launch_key(env: Mapping[str, str]) -> str:
    """What names one launch of the workers: ``mldist run``'s run id, else the bare launcher's job (one
    ``srun`` step, one ``mpiexec``); "" when nothing does.

    Example:
        >>> launch_key({"MLDIST_RUN_ID": "ab12"}), launch_key({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"})
        ('ab12', 'SLURM_JOB_ID=7.0')
    """
    if run_id := envvalues.RUN_ID.read(env):
        return run_id
    name = next((name for name in progress.JOB_KEYS if env.get(name)), None)
    if name is None:
        return ""
    step = f".{env.get('SLURM_STEP_ID', '')}" if name == "SLURM_JOB_ID" else ""
    return re.sub(r"\s", "_", f"{name}={env[name]}{step}")


def mark(where: Path, rank: int, launch: str, site: str) -> None:
    """Mark that rank ``rank`` of ``launch`` begins to join a group at ``site`` (``train.py:12``): its own file,
    and a line in ``group-joins``, the one file a rank finishing alone reads (:func:`marks`)."""
    site = " ".join(site.split())
    _put(where / f"group-{rank}.joining", f"{launch}\n{site}\n")
    _append(where / JOINS, f"+\t{rank}\t{launch}\t{site}\n")


def unmark(where: Path, rank: int) -> None:
    """Remove rank ``rank``'s mark (its join failed, and the script may go on alone)."""
    with contextlib.suppress(OSError):
        (where / f"group-{rank}.joining").unlink()
        _append(where / JOINS, f"-\t{rank}\n")


def marks(where: Path, launch: str) -> dict[int, str]:
    """The ranks of ``launch`` that began to join (and did not take it back), each with the line it joins at
    (see :func:`mark`): one file read, ``group-joins``."""
    found: dict[int, str] = {}
    for fields in _table(where / JOINS):
        if fields[0] == "+" and len(fields) == 4 and _RANK.fullmatch(fields[1]) and fields[2] == launch:
            found[int(fields[1])] = fields[3]
        elif fields[0] == "-" and len(fields) == 2 and _RANK.fullmatch(fields[1]):
            found.pop(int(fields[1]), None)
    return found


def ended(where: Path, launch: str) -> dict[int, str]:
    """The ranks of ``launch`` that finished without joining (``alone``) or on an error before (``failed``):
    one file read, ``group-ends`` (see :func:`write`)."""
    return {
        int(fields[0]): fields[1]
        for fields in _table(where / ENDS)
        if len(fields) == 3 and _RANK.fullmatch(fields[0]) and fields[1] in (ALONE, FAILED) and fields[2] == launch
    }


def noted(where: Path, ranks: Iterable[int], launch: str) -> dict[int, str]:
    """The notes of ``ranks`` of ``launch`` (each rank's own file: read only for the ranks asked about)."""
    notes = {}
    for rank in ranks:
        lines = _lines(where / f"group-{rank}")
        if lines and _HOW.fullmatch(lines[0]) and lines[1:2] == ([launch] if launch else []):
            notes[rank] = lines[0]
    return notes


#: The files that spare the ranks a listing of the folder: marks as they come, and the ranks that did not join.
JOINS, ENDS = "group-joins", "group-ends"
_RANK = re.compile(r"[0-9]{1,7}")


def _put(path: Path, text: str) -> None:
    """Write a small file whole (temp, rename) without fsync: it matters while the job runs, and the folder is
    made only when missing (the parent of every rank's file: no directory fsync per rank)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(OSError):
        try:
            tmp.write_text(text, encoding="utf-8")
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)


def _append(path: Path, line: str) -> None:
    """Add one line to ``path`` with a single ``O_APPEND`` write (whole lines on Lustre, GPFS and local disks)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def _table(path: Path) -> list[list[str]]:
    """The tab-separated fields of each whole line of ``path`` ([] when it is missing)."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        text = path.read_text(encoding="utf-8")
        return [line.split("\t") for line in text.split("\n")[:-1] if line]
    return []


def waiting(marked: Mapping[int, str], notes: Mapping[int, str]) -> dict[int, str]:
    """The ranks that began to join and are still there (no note at exit), each with its line.

    Example:
        >>> waiting({0: "t.py:3", 2: "t.py:3"}, {1: "alone", 2: "mldist.init"})
        {0: 't.py:3'}
    """
    return {rank: site for rank, site in sorted(marked.items()) if rank not in notes}


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks[:LISTED]))}" + (
        f" and {len(ranks) - LISTED} more" if len(ranks) > LISTED else ""
    )


#: How many ranks and places a half-formed line lists in full.
LISTED = 4


def half_formed(alone: Sequence[int], waits: Mapping[int, str], failed: Sequence[int] = ()) -> str:
    """The line when ranks ``alone`` finished without joining, or ranks ``failed`` ended on an error before
    they joined, while ranks ``waits`` (rank -> where it waits: ``start-up (train.py:12)``, a collective)
    wait for them.

    Example:
        >>> said = half_formed([1], {0: "start-up (train.py:12)"}).split("; ")
        >>> said[0][:39], said[1][:46]
        ('rank 1 exited without joining the group', 'rank 0 waits for it in start-up (train.py:12):')
        >>> half_formed([1, 3], {0: "start-up (t.py:2)", 2: "start-up (t.py:2)"}).split("; ")[1][:48]
        'ranks 0, 2 wait for them in start-up (t.py:2): e'
        >>> half_formed([], {0: "start-up (t.py:2)"}, failed=[1])
        "rank 1 ended on an error before it joined the group (the rank's own error line says which); rank 0 \
waits for it in start-up (t.py:2): the group cannot form, so it stops"
    """
    by_place: dict[str, list[int]] = {}
    for rank, place in sorted(waits.items()):
        by_place.setdefault(place, []).append(rank)
    them = "them" if len(alone) + len(failed) > 1 else "it"
    places = [
        f"{_ranks(ranks)} wait{'s' if len(ranks) == 1 else ''} for {them} in {place}"
        for place, ranks in list(by_place.items())[:LISTED]
    ]
    left = [f"{_ranks(sorted(alone))} exited without joining the group (no {_WAYS})"] if alone else []
    if failed:
        whose = "the rank's own error line" if len(failed) == 1 else "each rank's own error line"
        left.append(
            f"{_ranks(sorted(failed))} ended on an error before {'it' if len(failed) == 1 else 'they'} "
            f"joined the group ({whose} says which)"
        )
    advice = (
        "every rank must join (no join behind a condition that differs by rank, or after an early exit)"
        if alone
        else f"the group cannot form, so {'it stops' if len(waits) == 1 else 'they stop'}"
    )
    return f"{'; '.join([*left, *places])}: {advice}"


def clear(where: Path) -> None:
    """Remove the notes and marks of an earlier start (a reused run directory, a restarted group)."""
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
