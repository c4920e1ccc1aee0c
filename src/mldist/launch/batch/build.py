"""The ``JobSpec`` of ``mldist submit`` and ``mldist build-env``: options over a site profile over defaults.

The command line's options (by name, as argparse parses them) win over the site
profile's, which win over ``JobSpec``'s defaults; lists add up (profile first).
Paths are made absolute, the scheduler is detected when none is named, and the
spec is checked whole (:func:`.checks.check`) before it is returned.

Example::

    spec = build_spec({"scheduler": "slurm", "nodes": 2, "dry_run": True}, ["python", "train.py"])
"""

from __future__ import annotations

import shlex
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from .checks import check
from .records import probe
from .schedulers import detect_scheduler
from .sites import site_profile
from .spec import JobSpec

#: Options given as lists: a site profile's items come first, the command line's after.
_LISTS = ("modules", "binds", "directives", "env_source", "container_args")
#: Options the command line sets over a site profile when given.
_INT_OPTS = (
    "nodes",
    "min_nodes",
    "tasks_per_node",
    "gpus_per_node",
    "cpus_per_task",
    "hyperthreads",
    "grace",
    "cores_per_node",
)
_STR_OPTS: tuple[str, ...] = (
    "time",
    "dependency",
    "array",
    "account",
    "constraint",
    "queue",
    "job_name",
    "requeue",
    "tf_config",
    "mem",
    "mem_per_cpu",
    "launcher",
    "srun_mpi",
    "network_interface",
    "gpu_request",
    "module_purge",
    "stage_env",
    "stage_to",
)


#: The mldist package that submits: bound into a container that has none.
MLDIST_PACKAGE = Path(__file__).resolve().parents[2]


def _words(flag: str, text: str | None) -> tuple[str, ...]:
    """A --wrap or --container-args value split as a shell would split it (quotes group)."""
    if text is None:
        return ()
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise ConfigError(f"{flag} {text!r} cannot be split into words: {exc}") from None


def _local_path(value: str) -> str:
    return str(Path(value).expanduser().absolute()) if "://" not in value else value


def build_spec(
    options: Mapping[str, Any],
    command: Sequence[str],
    now: float | None = None,
    notes: list[str] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> JobSpec:
    """The JobSpec from CLI options over a site profile over defaults (``submit``'s and ``build-env``'s).

    A dry run (``options["dry_run"]``) needs no scheduler here (it renders for Slurm) and only warns
    about missing local files; a submission stops at them.

    Args:
        options: the parsed options by name, as ``vars(args)`` gives them (those a command leaves
            out, or sets to None, count as not given).
        command: each task's argv.
        now: the time stamped into the default output directory (default: now).
        notes: collects the dry run's one-line notes (default: printed to stderr at once).
        fixed: fields set whatever the profile and options say (``build-env``: one task, no venv).

    Example:
        spec = build_spec(vars(args), ["python", "train.py"], notes=notes)
    """
    opts: dict[str, Any] = dict(site_profile(options["site"])) if options.get("site") else {}
    env = dict(opts.pop("env", {}))
    partitions = opts.pop("partitions", {})
    for key in (*_INT_OPTS, *_STR_OPTS):
        if options.get(key) is not None:
            opts[key] = options[key]
    _node_range(opts)
    opts.update(fixed or {})
    if opts.get("queue") is None and partitions:
        opts["queue"] = partitions.get("gpu" if opts.get("gpus_per_node") else "cpu")
    for key in _LISTS:
        opts[key] = tuple(opts.get(key, ())) + tuple(options.get(key) or ())
    opts["container_args"] += _words("--container-args", options.get("container_args_text"))
    if options.get("wrap") is not None:
        opts["wrap"] = _words("--wrap", options["wrap"])
    opts["wrap"] = tuple(opts.get("wrap", ()))
    if options.get("keras_backend"):  # before --env, which may still say otherwise
        env["KERAS_BACKEND"] = options["keras_backend"]
    env.update(dict(options.get("env") or ()))
    opts["env"] = tuple(env.items())
    opts["unset"] = tuple(dict.fromkeys([*opts.get("unset", ()), *(options.get("unset") or ())]))
    say = notes.append if notes is not None else (lambda text: print(text, file=sys.stderr))
    opts["scheduler"] = options.get("scheduler") or opts.get("scheduler") or _detect(options, say)
    _paths(options, opts, say)
    name = opts.get("job_name", "mldist")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    out = options.get("output_dir") or f"mldist-jobs/{name}-{stamp}"
    opts["output_dir"] = str(Path(out).expanduser().absolute())
    return check(JobSpec(command=tuple(command), **opts))


def _node_range(opts: dict[str, Any]) -> None:
    """``--nodes MIN-MAX`` (a pair): an elastic job asking for that range; with ``--min-nodes`` it is one too many."""
    if not isinstance(opts.get("nodes"), tuple):
        return
    if opts.get("min_nodes") is not None:
        raise ConfigError("--nodes MIN-MAX and --min-nodes both set the minimum: give one")
    opts["min_nodes"], opts["nodes"] = opts["nodes"]
    opts["nodes_range"] = opts["min_nodes"] < opts["nodes"]
    if not opts["nodes_range"]:
        opts["min_nodes"] = None  # 2-2: a fixed world


def _detect(options: Mapping[str, Any], say: Callable[[str], None]) -> str:
    """This machine's scheduler; for a dry run without one, Slurm (said in one line)."""
    try:
        return detect_scheduler(shutil.which, probe)
    except ConfigError:
        if not options.get("dry_run"):
            raise
    say("mldist submit: note: no scheduler found here; the dry run renders for slurm (or give --scheduler pbs|cobalt)")
    return "slurm"


def _paths(options: Mapping[str, Any], opts: dict[str, Any], say: Callable[[str], None]) -> None:
    """Absolute paths for --venv, --container and friends; the files a job needs must exist.

    A dry run only warns about a missing one (it may be rendered on another machine).
    """
    for key in ("venv", "container", "container_cache"):
        value = options.get(key)
        if value is not None and not value.strip():
            raise ConfigError(f"--{key.replace('_', '-')} {value!r} names nothing; give a path (or leave it out)")
        if value is not None:
            opts[key] = _local_path(value)
    if options.get("conda") is not None:
        opts["conda"] = options["conda"]
    sources = tuple(_local_path(f) for f in opts["env_source"])
    opts["env_source"] = sources
    absent = [path for path in sources if not Path(path).is_file()]
    missing = [f"--env-source {path!r} is not a file; give the setup script's path" for path in absent]
    if opts.get("venv") and not (Path(opts["venv"]) / "bin" / "activate").is_file():
        missing.insert(0, f"--venv {opts['venv']!r} has no bin/activate; create it (mldist build-env) or fix the path")
    if missing and not options.get("dry_run"):
        raise ConfigError(missing[0])
    for text in missing:
        say(f"mldist submit: warning: {text} (a dry run goes on; submitting stops here)")
    if opts.get("container"):
        opts["mldist_path"] = str(MLDIST_PACKAGE)
    if opts.get("stage_env"):
        opts["stage_path"] = _stage_path(opts, bool(options.get("dry_run")), say)


def _stage_path(opts: Mapping[str, Any], dry_run: bool, say: Callable[[str], None]) -> str | None:
    """The environment ``--stage-env`` stages: the venv, a conda environment's path (None for a named one:
    the job stages the activated one), else the running mldist's own (``sys.prefix``).

    A dry run only warns about an environment that is not here.
    """
    if opts.get("venv"):
        return str(opts["venv"])
    conda = opts.get("conda")
    if conda and "/" not in conda:
        return None
    where = _local_path(conda) if conda else sys.prefix
    if not ((Path(where) / "pyvenv.cfg").is_file() or (Path(where) / "conda-meta").is_dir()):
        what = f"--conda {conda!r}" if conda else f"this mldist's Python environment ({where})"
        text = f"--stage-env: {what} is no virtual or conda environment; give --venv PATH or --conda NAME"
        if not dry_run or not conda:
            raise ConfigError(text)
        say(f"mldist submit: warning: {text} (a dry run goes on; submitting stops here)")
    return where
