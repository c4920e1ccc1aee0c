"""CLI command ``build-env``: build a virtual environment on a compute node through the scheduler.

Example:
    $ mldist build-env --venv ~/venvs/tf --module python/3.11 --time 30
    $ mldist submit --venv ~/venvs/tf --module python/3.11 --nodes 2 -- python train.py
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..launch.batch.buildenv import (
    FREEZE_NAME,
    BuildRequest,
    build_job,
    check_venv_path,
    constraints_of,
    follow_up,
    running_source,
)
from ..launch.batch.records import submit
from ..launch.batch.render import render
from ..launch.batch.schedulers import SCHEDULERS, detect_scheduler
from ..launch.batch.sites import site_profile
from ..launch.batch.spec import JobSpec
from .common import Handler, add_command

EXAMPLE = """\
example:
  mldist build-env --venv ~/venvs/tf --module python/3.11 --time 30
  mldist build-env --venv ~/venvs/tf-gpu --gpu --site polaris --account MYPROJ --requirements requirements.txt
  mldist build-env --venv ~/venvs/tf --dry-run          # print the job script only

The job (one node, one task) loads the modules, creates the venv with python3 -m venv
(an existing venv is updated), upgrades pip, installs mldist with TensorFlow
([cpu] extra, or [gpu] with --gpu) and the requirements, checks that mldist and
tensorflow import, and records pip freeze in VENV/mldist-build.txt and the job
directory. mldist comes from the source tree this mldist runs from, else from
the package index (mldist==VERSION); --source overrides. Paths must be on a file
system the compute nodes see. Then: mldist submit --venv VENV (same --module)."""

#: Options a site profile may give the build job (geometry and containers stay out).
_SITE_KEYS = ("scheduler", "modules", "queue", "account", "constraint", "directives", "env", "unset")
_MODULE = re.compile(r"[^\s\x00-\x1f\x7f]+")


def _module(text: str) -> str:
    """A module name: one word, no blanks or control characters (argparse type)."""
    if not _MODULE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a module name (one word, no blanks or newlines)")
    return text


def register(sub: Any) -> dict[str, Handler]:
    """Add ``build-env`` to the subcommands; its handler by name."""
    p = add_command(
        sub,
        "build-env",
        "build a virtual environment with mldist and TensorFlow in a batch job",
        EXAMPLE,
        "Write and submit a one-node job that builds VENV on a compute node, then print how to use it.",
    )
    p.add_argument("--venv", required=True, help="the venv to create (or update, if it is one)")
    p.add_argument("--module", action="append", dest="modules", type=_module, help="module to load (repeatable)")
    p.add_argument("--requirements", help="a requirements file installed with mldist")
    p.add_argument("--gpu", action="store_true", help="TensorFlow with CUDA (the [gpu] extra), not [cpu]")
    p.add_argument("--source", help="where mldist comes from: a directory, a wheel or a requirement")
    p.add_argument("--scheduler", choices=list(SCHEDULERS), help="default: the site's, else detected")
    p.add_argument("--site", help="a site profile: its scheduler, modules, queue, account, directives, env")
    p.add_argument("--partition", "--queue", dest="queue", help="partition (Slurm) or queue (PBS, Cobalt)")
    p.add_argument("--account", help="project to charge")
    p.add_argument("--time", default="1:00:00", help="time limit: M, H:MM:SS or D-HH:MM:SS (default 1:00:00)")
    p.add_argument("--output-dir", help="script and logs (default mldist-jobs/NAME-TIME)")
    p.add_argument("--job-name", default="mldist-build-env", help="job name (default mldist-build-env)")
    p.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    return {"build-env": _cmd_build_env}


def _absolute(text: str, flag: str) -> Path:
    """``text`` as an absolute path (``~`` expanded), refusing control characters first."""
    if re.search(r"[\x00-\x1f\x7f]", text) or not text:
        raise ConfigError(f"{flag} {text!r} is empty or holds a control character (newline, tab, ...)")
    return Path(text).expanduser().absolute()


def _source(text: str | None) -> str:
    """What ``--source`` names (an existing path, made absolute, or a requirement), else the running mldist's."""
    if text is None:
        return running_source()
    if text.startswith(("/", ".", "~")) or Path(text).exists():
        path = _absolute(text, "--source")
        if not path.exists():
            raise ConfigError(f"--source {text!r} does not exist; give a directory, a wheel or a requirement")
        return str(path)
    return text


def _probe(argv: list[str]) -> str:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return res.stdout + res.stderr


def job_options(args: argparse.Namespace, now: float | None = None) -> dict[str, Any]:
    """JobSpec fields of the build job from the options over the site profile.

    Args:
        args: the parsed ``build-env`` options.
        now: the time stamped into the default output directory (default: now).
    """
    site = site_profile(args.site) if args.site else {}
    opts: dict[str, Any] = {k: site[k] for k in _SITE_KEYS if k in site}
    opts["env"] = tuple(dict(opts.get("env", {})).items())
    for key in ("directives", "unset"):
        opts[key] = tuple(opts.get(key, ()))
    opts["modules"] = tuple(opts.get("modules", ())) + tuple(args.modules or ())
    for key in ("queue", "account"):
        if getattr(args, key) is not None:
            opts[key] = getattr(args, key)
    opts["scheduler"] = args.scheduler or opts.get("scheduler") or detect_scheduler(shutil.which, _probe)
    opts["time"], opts["job_name"] = args.time, args.job_name
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    # The default holds the job name, which JobSpec checks (and names) itself.
    out = (
        _absolute(args.output_dir, "--output-dir") if args.output_dir else Path(f"mldist-jobs/{args.job_name}-{stamp}")
    )
    opts["output_dir"] = str(out.absolute())
    return opts


def build_spec(args: argparse.Namespace, now: float | None = None) -> JobSpec:
    """The build job's JobSpec from ``build-env`` options; ConfigError for bad input.

    Args:
        args: the parsed ``build-env`` options.
        now: the time stamped into the default output directory (default: now).
    """
    venv = _absolute(args.venv, "--venv")
    check_venv_path(venv)
    requirements = None
    if args.requirements is not None:
        path = _absolute(args.requirements, "--requirements")
        if not path.is_file():
            raise ConfigError(f"--requirements {args.requirements!r} is not a file")
        requirements = str(path)
    source = _source(args.source)
    req = BuildRequest(str(venv), source, args.gpu, requirements, constraints_of(source))
    return build_job(req, **job_options(args, now))


def _cmd_build_env(args: argparse.Namespace) -> int:
    spec = build_spec(args)
    if args.dry_run:
        sys.stdout.write(render(spec))
        return 0
    record = submit(spec)
    venv = spec.command[4]
    print(f"submitted build job {record.job_id} ({record.scheduler}) for {venv}")
    print(f"logs: {record.output_dir}  (mldist logs {record.job_id} --follow; pip freeze: {FREEZE_NAME} there)")
    print(f"once it has COMPLETED (mldist status {record.job_id}):")
    # A --site brings its modules again; the --module ones are added to them.
    print("  " + follow_up(venv, args.modules or (), args.site, args.scheduler))
    return 0
