"""Container images pulled on the login node before submitting (``mldist submit --container-pull login``).

Compute nodes often have no internet, or only through a proxy that a profile unsets
for gRPC; the Apptainer guide pulls the image once, beforehand. With ``login`` (the
default when the image is a registry reference and ``apptainer`` or ``singularity``
is on the login node's PATH) mldist pulls ``docker://...`` into a SIF file, in
``--container-cache`` or else the job directory, and the job runs that file; with
``job`` the job pulls it itself (before it unsets any proxy).

:func:`plan_pull` is pure (a spec in, the spec that runs the SIF and the pull out);
:func:`pull_image` is the side effect.

Example:
    >>> from mldist.launch.batch.spec import JobSpec
    >>> spec = JobSpec(command=("python",), container="docker://tf/tf:2.16", output_dir="/w/job")
    >>> spec, pull = plan_pull(spec, None, {"apptainer": "/usr/bin/apptainer"}.get)
    >>> spec.container, pull.argv("/w/job/tf_tf_2.16.sif.part")
    ('/w/job/tf_tf_2.16.sif', ['/usr/bin/apptainer', 'pull', '--force', '/w/job/tf_tf_2.16.sif.part', 'docker://tf/tf:2.16'])
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ...base.files import fsync_dir, make_dirs
from ...errors import ConfigError, LaunchError
from .software import sif_name
from .spec import JobSpec

#: ``--container-pull``: before submitting, on the login node; or in the job.
PULL_MODES = ("login", "job")
#: The programs that pull, in order of preference.
PULL_TOOLS = ("apptainer", "singularity")


@dataclass(frozen=True)
class Pull:
    """One image to pull on the login node.

    Args:
        tool: the ``apptainer`` (or ``singularity``) executable.
        uri: the image, e.g. ``docker://tensorflow/tensorflow:2.16.1-gpu``.
        dest: the SIF file the job runs.

    Example:
        >>> Pull("apptainer", "docker://a/b:1", "/w/a_b_1.sif").shell()
        'apptainer pull /w/a_b_1.sif docker://a/b:1'
    """

    tool: str
    uri: str
    dest: str

    def argv(self, part: str) -> list[str]:
        """The pull into ``part`` (renamed to ``dest`` once whole)."""
        return [self.tool, "pull", "--force", part, self.uri]

    def shell(self) -> str:
        """The pull as one shell line, for messages."""
        return shlex.join([self.tool, "pull", self.dest, self.uri])


def pull_tool(which: Callable[[str], str | None]) -> str | None:
    """The first of :data:`PULL_TOOLS` on PATH, else None."""
    return next((found for found in map(which, PULL_TOOLS) if found), None)


def plan_pull(
    spec: JobSpec, mode: str | None, which: Callable[[str], str | None], say: Callable[[str], None] | None = None
) -> tuple[JobSpec, Pull | None]:
    """Where the image is pulled: the spec the job runs, and the login-node pull (None: the job pulls, if at all).

    Args:
        spec: the job, its ``container`` as given.
        mode: ``--container-pull`` (``login``, ``job``), or None: ``login`` when a pull tool is on PATH.
        which: ``shutil.which``.
        say: a dry run's notes: what would stop a submission is said there instead (None: it stops).
    """
    if mode is not None and mode not in PULL_MODES:
        raise ConfigError(f"--container-pull {mode!r} is not one of {', '.join(PULL_MODES)}")
    if mode is not None and not spec.remote_image:
        what = f"--container {spec.container!r} is a local image" if spec.container else "there is no --container"
        raise ConfigError(f"--container-pull {mode}: {what}, so nothing is pulled; drop --container-pull")
    if not spec.remote_image or mode == "job":
        return spec, None
    tool = pull_tool(which)
    if tool is None and mode == "login":
        missing = "--container-pull login: neither apptainer nor singularity is on PATH here"
        if say is None:
            raise ConfigError(f"{missing}; load its module, or use --container-pull job")
        say(f"mldist submit: dry run: {missing}; a submission from here would stop (load its module first)")
        tool = "apptainer"
    if tool is None:
        return spec, None
    assert spec.container
    folder = spec.container_cache or spec.output_dir
    dest = str(Path(folder) / sif_name(spec.container))
    return dataclasses.replace(spec, container=dest), Pull(tool, spec.container, dest)


def pull_image(pull: Pull, env: Mapping[str, str] | None = None) -> bool:
    """Pull ``pull.uri`` into ``pull.dest`` (kept if it is there already); True when it pulled.

    The pull writes a ``.part`` file renamed into place once whole, so a broken pull
    never leaves a SIF that looks usable. ``APPTAINER_CACHEDIR`` defaults to
    ``$TMPDIR/apptainer-cache-UID`` as in the job (the guides keep it off ``$HOME``).

    Args:
        pull: what to pull where.
        env: the environment of the pull (default: this one).
    """
    dest = Path(pull.dest)
    if dest.is_file() and dest.stat().st_size > 0:
        print(f"mldist: using {dest} (pulled before; remove it to pull {pull.uri} again)", flush=True)
        return False
    make_dirs(dest.parent, 0o700)
    env = dict(os.environ if env is None else env)
    env.setdefault("APPTAINER_CACHEDIR", f"{env.get('TMPDIR') or '/tmp'}/apptainer-cache-{os.getuid()}")
    part = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    print(f"mldist: pulling {pull.uri} into {dest} on this node", flush=True)
    try:
        code = subprocess.run(pull.argv(str(part)), env=env, stdin=subprocess.DEVNULL).returncode
    except OSError as exc:
        raise LaunchError(f"cannot run {pull.tool}: {exc}") from None
    if code != 0 or not part.is_file():
        part.unlink(missing_ok=True)
        raise LaunchError(
            f"{pull.shell()} failed (exit {code}; see above): check the image name, or use --container-pull job"
        )
    os.replace(part, dest)
    fsync_dir(dest.parent)
    return True
