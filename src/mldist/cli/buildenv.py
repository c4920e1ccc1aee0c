"""CLI command ``build-env``: build a virtual environment on a compute node through the scheduler.

Example:
    $ mldist build-env --venv ~/venvs/tf --module python/3.11 --time 30
    $ mldist submit --venv ~/venvs/tf --module python/3.11 --nodes 2 -- python train.py
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..launch.batch.wheelhouse import PLATFORM, PYTHON_VERSION, Wheelhouse
from .common import Handler, add_command
from .jobs import add_job_options

if TYPE_CHECKING:  # the job builders load when the command runs, not for every mldist command
    from ..launch.batch.buildenv import BuildRequest
    from ..launch.batch.spec import JobSpec

EXAMPLE = """\
example:
  mldist build-env --venv ~/venvs/tf --module python/3.11 --time 30
  mldist build-env --venv ~/venvs/tf-gpu --gpu --site saga --account MYPROJ --requirements requirements.txt
  mldist build-env --venv /proj/venvs/tf --module python/3.11 --wheelhouse /proj/wheels   # nodes without internet
  mldist build-env --venv ~/venvs/tf --dry-run          # print the job script only
  mldist build-env --venv ~/venvs/jax --backend jax     # Keras 3 on JAX: the [jax] extra ([jax-cuda] with --gpu)

The job (one node, one task, --time 1:00:00 unless given) loads the modules, creates the venv
with python3 -m venv (an existing venv is updated), upgrades pip, installs mldist with TensorFlow
([cpu] extra, or [gpu] with --gpu, on a node with one GPU unless --gpus-per-node says)
and the requirements, checks that mldist and tensorflow import, and records pip freeze
in VENV/mldist-build.txt and the job directory. mldist comes from the source tree this
mldist runs from, else from the package index (mldist==VERSION); --source overrides.
The job takes the site profile and submit's options (partition, modules, module purge,
memory, --constraint, --env, --directive, ...) as the training job will, but runs one
task, activates nothing and keeps the proxies (pip needs them).
With --wheelhouse DIR, this command first downloads every wheel the venv needs into DIR
(pip download --only-binary=:all:, for --python-version/--platform, else the Python a
python/3.X module names, else this one's) and the job installs with pip install
--no-index --find-links DIR: it never touches the network. Paths must be on a file
system the compute nodes see. Then: mldist submit --venv VENV (same --module)."""

#: ``submit``'s options the one-task build job has no use for (``--venv`` is its own here).
NOT_FOR_BUILD = (
    "--nodes",
    "--tasks-per-node",
    "--grace",
    "--array",
    "--requeue",
    "--venv",
    "--conda",
    "--container",
    "--container-cache",
    "--container-pull",
    "--bind",
    "--container-args",
    "--wrap",
    "--unset",
    "--network-interface",
    "--stage-env",
    "--stage-to",
)
#: What the build job is whatever a profile says: one task, nothing activated, the proxies kept for pip.
BUILD_FIXED: dict[str, Any] = {
    "nodes": 1,
    "tasks_per_node": 1,
    "venv": None,
    "conda": None,
    "container": None,
    "container_args": (),
    "wrap": (),
    "requeue": False,
    "array": None,
    "unset": (),
    "stage_env": False,
}


def _platform(text: str) -> str:
    """A wheel platform tag (argparse type)."""
    if not PLATFORM.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a wheel platform tag (e.g. manylinux2014_x86_64)")
    return text


def _python_version(text: str) -> str:
    """A Python version like 3.11 (argparse type)."""
    if not PYTHON_VERSION.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Python version like 3.11")
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
    p.add_argument("--venv", required=True, dest="build_venv", metavar="VENV", help="the venv to create or update")
    p.add_argument("--requirements", help="a requirements file installed with mldist")
    p.add_argument("--gpu", action="store_true", help="TensorFlow with CUDA (the [gpu] extra), not [cpu]")
    p.add_argument(
        "--backend",
        choices=("tensorflow", "jax"),
        default="tensorflow",
        help="Keras's backend: jax installs the [jax] extra ([jax-cuda] with --gpu); default tensorflow",
    )
    p.add_argument("--source", help="where mldist comes from: a directory, a wheel or a requirement")
    p.add_argument("--wheelhouse", help="download every wheel here first; the job installs from it offline")
    p.add_argument("--python-version", type=_python_version, help="the nodes' Python for --wheelhouse, e.g. 3.11")
    p.add_argument(
        "--platform",
        action="append",
        dest="platforms",
        type=_platform,
        help="the nodes' wheel platform tag for "
        "--wheelhouse (repeatable), e.g. manylinux2014_aarch64; default: this machine's",
    )
    add_job_options(p, skip=NOT_FOR_BUILD)
    p.set_defaults(time="1:00:00", job_name="mldist-build-env")
    return {"build-env": _cmd_build_env}


def _absolute(text: str, flag: str) -> Path:
    """``text`` as an absolute path (``~`` expanded), refusing control characters first."""
    if re.search(r"[\x00-\x1f\x7f]", text) or not text:
        raise ConfigError(f"{flag} {text!r} is empty or holds a control character (newline, tab, ...)")
    return Path(text).expanduser().absolute()


def _source(text: str | None) -> str:
    """What ``--source`` names (an existing path, made absolute, or a requirement), else the running mldist's."""
    from ..launch.batch.buildenv import running_source

    if text is None:
        return running_source()
    if text.startswith(("/", ".", "~")) or Path(text).exists():
        path = _absolute(text, "--source")
        if not path.exists():
            raise ConfigError(f"--source {text!r} does not exist; give a directory, a wheel or a requirement")
        return str(path)
    return text


def _wheelhouse_dir(args: argparse.Namespace) -> str | None:
    """The ``--wheelhouse`` directory (absolute), or None; its companions without it are refused."""
    if args.wheelhouse is None:
        for flag, value in (("--python-version", args.python_version), ("--platform", args.platforms)):
            if value:
                raise ConfigError(f"{flag} says which wheels --wheelhouse downloads; give --wheelhouse DIR too")
        return None
    path = _absolute(args.wheelhouse, "--wheelhouse")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--wheelhouse {args.wheelhouse!r} is not a directory; give a directory for the wheels")
    above = next(p for p in path.parents if p.exists())  # what the wheelhouse would be made in
    if not path.exists() and not above.is_dir():
        raise ConfigError(
            f"--wheelhouse {args.wheelhouse!r}: {above} is a file, so no directory can be made "
            "below it; give a directory for the wheels"
        )
    if not path.exists() and not os.access(above, os.W_OK | os.X_OK):
        raise ConfigError(f"--wheelhouse {args.wheelhouse!r}: {above} is not writable; give a directory you can write")
    return str(path)


@dataclass(frozen=True)
class BuildPlan:
    """What ``build-env`` does: fill the wheelhouse (if any) from ``source``, then submit ``spec``.

    Args:
        spec: the build job (``submit``'s own JobSpec, one task).
        request: what the job builds.
        source: where mldist comes from, as ``--source`` named it (a tree, a wheel, a requirement).
        wheelhouse: the wheelhouse filled on this node first, if any.
    """

    spec: JobSpec
    request: BuildRequest
    source: str
    wheelhouse: Wheelhouse | None = None

    @property
    def target(self) -> str:
        """What the job's pip installs."""
        from ..launch.batch.buildenv import install_target

        return install_target(self.request.source, self.request.flavour)


def build_plan(args: argparse.Namespace, now: float | None = None) -> BuildPlan:
    """The build job from ``build-env`` options, through ``submit``'s :func:`build_spec`; ConfigError for bad input.

    Args:
        args: the parsed ``build-env`` options.
        now: the time stamped into the default output directory (default: now).
    """
    from ..launch.batch.build import build_spec
    from ..launch.batch.buildenv import BuildRequest, build_command, check_venv_path, constraints_of
    from ..launch.batch.wheelhouse import python_of_modules, wheelhouse_source

    venv = _absolute(args.build_venv, "--venv")
    check_venv_path(venv)
    requirements = None
    if args.requirements is not None:
        path = _absolute(args.requirements, "--requirements")
        if not path.is_file():
            problem = f"--requirements {args.requirements!r} is not a file"
            if not args.dry_run:
                raise ConfigError(problem)
            print(f"mldist build-env: warning: {problem} (a dry run goes on; submitting stops here)", file=sys.stderr)
        requirements = str(path)
    source, house = _source(args.source), _wheelhouse_dir(args)
    wanted = wheelhouse_source(source) if house else source
    req = BuildRequest(str(venv), wanted, args.gpu, requirements, constraints_of(source), house, args.backend)
    gpus = args.gpus_per_node if args.gpus_per_node is not None else int(args.gpu)
    spec = build_spec(vars(args), build_command(req), now, fixed={**BUILD_FIXED, "gpus_per_node": gpus})
    if house is None:
        return BuildPlan(spec, req, source)
    # The nodes' Python: given, else the one a python/3.X module (the profile's too) names.
    version = args.python_version or python_of_modules(spec.modules)
    return BuildPlan(spec, req, source, Wheelhouse(house, version, tuple(args.platforms or ())))


def _cmd_build_env(args: argparse.Namespace) -> int:
    from ..launch.batch.buildenv import FREEZE_NAME, follow_up
    from ..launch.batch.records import submit
    from ..launch.batch.render import render
    from ..launch.batch.wheelhouse import download_argv, fill_wheelhouse

    plan = build_plan(args)
    req, house = plan.request, plan.wheelhouse
    if args.dry_run:
        if house:
            argv = download_argv(sys.executable, house, plan.target, req.requirements, req.constraints)
            print(
                f"mldist build-env: dry run: {house.path} is not filled (it would be: {shlex.join(argv)})",
                file=sys.stderr,
            )
        sys.stdout.write(render(plan.spec))
        return 0
    if house:
        fill_wheelhouse(house, plan.source, plan.target, req.requirements, req.constraints)
    record = submit(plan.spec)
    print(f"submitted build job {record.job_id} ({record.scheduler}) for {req.venv}")
    print(f"logs: {record.output_dir}  (mldist logs {record.job_id} --follow; pip freeze: {FREEZE_NAME} there)")
    print(f"once it has COMPLETED (mldist status {record.job_id}):")
    # A --site brings its modules again; the --module ones are added to them.
    print("  " + follow_up(req.venv, args.modules or (), args.site, args.scheduler, args.module_purge))
    return 0
