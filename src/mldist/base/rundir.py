"""The run directory's names and writers, shared by the launcher, the workers and the tools.

``mldist run`` makes one directory per run (``--run-dir DIR``, default
``runs/<script>-<YYYYmmdd-HHMMSS>``) and tells the workers where it is through
``MLDIST_RUN_DIR``; each worker may leave its report there (``rank-R.metrics.json``,
written by ``mldist.keras.RunLog`` and the bench worker). This module holds what
both sides need: the names, the directory's creation and the atomic JSON writes.
What ``mldist run`` records itself (config.json, summary.json) is in
:mod:`mldist.launch.rundir`.

Example:
    >>> import datetime
    >>> run_name(["python", "examples/digits_cnn.py", "--epochs", "2"])
    'digits_cnn'
    >>> run_dir_name(["python", "train.py"], datetime.datetime(2026, 11, 24, 1, 2, 3))
    'train-20261124-010203'
"""

from __future__ import annotations

import datetime
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from . import envvalues
from .files import atomic_write, make_dirs

#: The variable that tells every worker where the run directory is.
RUN_DIR_ENV = envvalues.RUN_DIR.name
#: Where default run directories go, relative to the working directory.
RUNS = "runs"
#: The report each worker writes (``mldist.keras.RunLog``) and the summary merges.
METRICS_FILE = "rank-{rank}.metrics.json"
#: Matches a worker report's file name; group 1 is its rank.
METRICS_RE = re.compile(r"rank-([0-9]{1,6})\.metrics\.json")
#: The variable that turns RunLog's metrics.png off in a job (a no), without changing the script.
PLOT_ENV = envvalues.PLOT.name
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def plot_wanted(env: Mapping[str, str]) -> bool:
    """Whether ``RunLog`` draws metrics.png when the script does not say: ``MLDIST_PLOT`` yes (default) or no.

    Drawing imports matplotlib on rank 0 (about a second here; more from a slow shared file system).

    Example:
        >>> plot_wanted({}), plot_wanted({"MLDIST_PLOT": "0"}), plot_wanted({"MLDIST_PLOT": "no"})
        (True, False, False)
    """
    return envvalues.PLOT.read(env)


#: Modules that run the script (or ``-m MODULE``) given after them: a run of one is named for that.
RUNNERS = frozenset({"mldist.horovod.alias", "cProfile", "profile", "pdb", "trace"})


def run_name(command: Sequence[str]) -> str:
    """A short name for a run of ``command``: the script's stem, the module of ``-m``, else the program.

    A module of :data:`RUNNERS` is passed over: the script it runs names the run.

    Example:
        >>> run_name(["/v/bin/python", "-u", "train.py"])
        'train'
        >>> run_name(["python", "-m", "pkg.trainer", "--lr", "1"])
        'trainer'
        >>> run_name(["./job.sh"])
        'job'
        >>> run_name(["python", "-m", "mldist.horovod.alias", "hvd_train", "--epochs", "2"])
        'hvd_train'
    """
    words = list(command)
    for i, word in enumerate(words):
        if word == "-m" and i + 1 < len(words):
            if words[i + 1] in RUNNERS and words[i + 2 :]:
                return run_name(words[i + 2 :])
            return _safe(words[i + 1].rsplit(".", 1)[-1])
        if word.endswith(".py") and not word.startswith("-"):
            return _safe(Path(word).stem)
    program = next((word for word in words if not word.startswith("-")), None)  # past a runner's options
    return _safe(Path(program).stem) if program else "run"


def _safe(name: str) -> str:
    return _UNSAFE.sub("_", name).strip("._") or "run"


def run_dir_name(command: Sequence[str], when: datetime.datetime) -> str:
    """``<name>-<YYYYmmdd-HHMMSS>`` for a run of ``command`` started at ``when``.

    Example:
        >>> run_dir_name(["bash", "-c", "true"], datetime.datetime(2026, 1, 2, 3, 4, 5))
        'bash-20260102-030405'
    """
    return f"{run_name(command)}-{when:%Y%m%d-%H%M%S}"


def runs_root() -> tuple[Path, str]:
    """Where default run directories go, and how the user named it: ``MLDIST_RUNS_DIR``, else ``runs``.

    Example:
        >>> runs_root()[1] in ("MLDIST_RUNS_DIR", "runs")
        True
    """
    chosen = envvalues.RUNS_DIR.read(os.environ)
    return (Path(chosen), envvalues.RUNS_DIR.name) if chosen else (Path(RUNS), "runs")


def default_run_dir(command: Sequence[str], root: str | os.PathLike[str] | None = None) -> Path:
    """A run directory under ``root`` that does not exist yet: ``root/<name>-<time>`` (``-2``, ... if taken).

    Args:
        command: the worker command (its script names the run).
        root: the parent directory (default ``MLDIST_RUNS_DIR``, else ``runs``).

    Example:
        >>> import tempfile
        >>> default_run_dir(["python", "train.py"], tempfile.mkdtemp()).name.startswith("train-")
        True
    """
    root = root if root is not None else runs_root()[0]
    base = Path(root) / run_dir_name(command, datetime.datetime.now())
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def prepare_run_dir(path: str | os.PathLike[str], flag: str = "--run-dir", create: bool = True) -> Path:
    """Create the run directory (owner-only; an existing one is reused) or raise ConfigError saying why not.

    Args:
        path: the directory.
        flag: how the user named it, for the error.
        create: False only checks that it could be made (a run refused later leaves nothing behind).

    Example:
        >>> import tempfile
        >>> prepare_run_dir(Path(tempfile.mkdtemp()) / "r").is_dir()
        True
        >>> prepare_run_dir(Path(tempfile.mkdtemp()) / "a" / "b", create=False).exists()
        False
    """
    where = Path(path)
    if where.exists() and not where.is_dir():
        raise ConfigError(f"{flag} {str(where)!r} is a file; name a directory")
    if not create:
        _creatable(where, flag)
        return where
    try:
        make_dirs(where, 0o700)
    except OSError as exc:
        raise ConfigError(
            f"{flag} {str(where)!r} cannot be created ({exc.strerror}); name a writable directory"
        ) from None
    if not os.access(where, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {str(where)!r} is not writable; name a writable directory")
    return where


def _creatable(where: Path, flag: str) -> None:
    """ConfigError unless ``where`` exists writable or its nearest existing parent lets it be made."""
    found = next((p for p in (where.absolute(), *where.absolute().parents) if p.exists()), Path("/"))
    if not found.is_dir():
        raise ConfigError(f"{flag} {str(where)!r} cannot be created ({found} is a file); name a writable directory")
    if not os.access(found, os.W_OK | os.X_OK):
        what = "is not writable" if found == where.absolute() else f"cannot be created ({found} is not writable)"
        raise ConfigError(f"{flag} {str(where)!r} {what}; name a writable directory")


def now_iso() -> str:
    """The local time with its UTC offset, to the second (``2026-11-24T01:02:03+01:00``)."""
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def read_reports(run_dir: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """The workers' ``rank-R.metrics.json`` reports by rank (unreadable ones are skipped).

    Example:
        >>> import tempfile
        >>> read_reports(tempfile.mkdtemp())
        {}
    """
    out: dict[int, dict[str, Any]] = {}
    for path in Path(run_dir).iterdir():
        match = METRICS_RE.fullmatch(path.name)
        if not match:
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            out[int(match.group(1))] = data
    return out


def write_json(path: str | os.PathLike[str], data: Mapping[str, Any]) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically (temp file, fsync, rename).

    Example:
        >>> import tempfile
        >>> write_json(Path(tempfile.mkdtemp()) / "a.json", {"x": 1}).read_text()
        '{\\n  "x": 1\\n}\\n'
    """
    return atomic_write(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
