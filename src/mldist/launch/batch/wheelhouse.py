"""The wheelhouse of ``mldist build-env --wheelhouse DIR``: every wheel the build job needs, fetched beforehand.

Compute nodes often have no internet (the centre guides: "KNL nodes have no
internet; build the venv on the login node"). So on the login node, when the
command runs, mldist builds its own wheel (from a source tree) and runs ``pip
download --only-binary=:all:`` for mldist's extra, TensorFlow, the requirements
file and pip itself, for the compute nodes' Python and platform when given (or
read from a ``python/3.11``-style module), else this Python's. The job then
installs with ``pip install --no-index --find-links DIR`` and never asks an index.

The argv builders are pure; :func:`fill_wheelhouse` runs them.

Example:
    >>> house = Wheelhouse("/w/wheels", python_version="3.11")
    >>> download_argv("python3", house, "mldist[cpu]==0.1.0")[3:]
    ['download', '--only-binary=:all:', '--dest', '/w/wheels', '--find-links', '/w/wheels', \
'--python-version', '3.11', 'pip', 'mldist[cpu]==0.1.0']
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...base.files import atomic_write_with, fsync_dir, make_dirs
from ...errors import ConfigError, LaunchError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser from PyPI (a declared dependency there)
    import tomli as tomllib

#: ``--python-version``: what pip's option takes, dotted (3.11, 3.11.9).
PYTHON_VERSION = re.compile(r"3(\.[0-9]{1,2}){1,2}")
#: ``--platform``: a wheel platform tag (manylinux2014_x86_64, manylinux_2_28_aarch64, linux_x86_64).
PLATFORM = re.compile(r"[A-Za-z0-9_.]{1,100}")
#: A module that names the nodes' Python: python/3.11, python3/3.10.4, cray-python/3.11.5.
_PYTHON_MODULE = re.compile(r"(?:cray-)?python3?/(3\.[0-9]{1,2})(?:[._+-][^/]*)?", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Wheelhouse:
    """Where the wheels go, and for which Python and platform.

    Args:
        path: an absolute directory on a file system the compute nodes see.
        python_version: the nodes' Python (``3.11``); None: this Python's.
        platforms: wheel platform tags of the nodes; empty: this machine's.

    Example:
        >>> Wheelhouse("/w/wheels", platforms=("manylinux2014_x86_64",)).platforms
        ('manylinux2014_x86_64',)
    """

    path: str
    python_version: str | None = None
    platforms: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.path.startswith("/") or _CONTROL.search(self.path):
            raise ConfigError(f"--wheelhouse {self.path!r} must be an absolute path without control characters")
        if self.python_version is not None and not PYTHON_VERSION.fullmatch(self.python_version):
            raise ConfigError(f"--python-version {self.python_version!r}: give the nodes' Python like 3.11")
        for tag in self.platforms:
            if not PLATFORM.fullmatch(tag):
                raise ConfigError(f"--platform {tag!r}: give a wheel platform tag like manylinux2014_x86_64")


def python_of_modules(modules: Sequence[str]) -> str | None:
    """The Python version the last ``python/3.X``-style module names, else None.

    Example:
        >>> python_of_modules(["gcc/12", "cray-python/3.11.5"]), python_of_modules(["cuda/12.2"])
        ('3.11', None)
    """
    found = [m.group(1) for m in map(_PYTHON_MODULE.fullmatch, modules) if m]
    return found[-1] if found else None


def source_version(path: str) -> str:
    """The version of mldist in a source tree (its ``pyproject.toml``) or a built wheel (its name).

    Example:
        >>> source_version("/w/mldist-0.2.0-py3-none-any.whl")
        '0.2.0'
    """
    hint = "give mldist's source tree, a built mldist wheel or a requirement like mldist==0.1.0"
    if path.endswith(".whl"):
        name, _, rest = Path(path).name.partition("-")
        version = rest.partition("-")[0]
        if name.lower() != "mldist" or not version:
            raise ConfigError(f"--source {path!r} is not an mldist wheel (mldist-VERSION-...whl); {hint}")
        return version
    try:
        project = tomllib.loads((Path(path) / "pyproject.toml").read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        project = {}
    found = project.get("version") if project.get("name") == "mldist" else None
    if not isinstance(found, str):
        raise ConfigError(f"--source {path!r} has no pyproject.toml naming mldist and its version; {hint}")
    return found


def wheelhouse_source(source: str) -> str:
    """What the job asks the wheelhouse for: ``mldist==VERSION`` for a tree or a wheel, a requirement as it is.

    Example:
        >>> wheelhouse_source("mldist>=0.1"), wheelhouse_source("/w/mldist-0.1.0-py3-none-any.whl")
        ('mldist>=0.1', 'mldist==0.1.0')
    """
    if source.startswith("/"):
        return f"mldist=={source_version(source)}"
    if "://" in source or " @ " in source:
        raise ConfigError(f"--source {source!r} with --wheelhouse: give a source tree, a wheel or mldist==VERSION")
    return source


def wheel_argv(python: str, tree: str, dest: str) -> list[str]:
    """Build mldist's own wheel from a source tree (pure Python: one wheel fits every node)."""
    return [python, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", dest, tree]


def download_argv(
    python: str, house: Wheelhouse, target: str, requirements: str | None = None, constraints: str | None = None
) -> list[str]:
    """``pip download`` of pip, ``target`` and the requirements, wheels only, for the nodes' Python and platform.

    Args:
        python: the Python whose pip downloads.
        house: where, and for which Python and platform.
        target: what the job installs, e.g. ``mldist[gpu]==0.1.0`` (found in the wheelhouse if built there).
        requirements: a requirements file, if any.
        constraints: a constraints file, if any.
    """
    argv = [python, "-m", "pip", "download", "--only-binary=:all:", "--dest", house.path, "--find-links", house.path]
    argv += ["--python-version", house.python_version] if house.python_version else []
    for tag in house.platforms:
        argv += ["--platform", tag]
    argv += ["pip", target]
    argv += ["-r", requirements] if requirements else []
    return argv + (["-c", constraints] if constraints else [])


def _run(argv: list[str], what: str) -> None:
    try:
        code = subprocess.run(argv, stdin=subprocess.DEVNULL).returncode
    except OSError as exc:
        raise LaunchError(f"cannot run {argv[0]}: {exc}") from None
    if code != 0:
        raise LaunchError(f"{what} failed (exit {code}; pip's messages are above)")


def _add_own_wheel(python: str, source: str, house: Path) -> None:
    """mldist's wheel into the wheelhouse: built from a source tree, or copied from a wheel file."""
    if source.endswith(".whl"):
        with open(source, "rb") as src:
            atomic_write_with(house / Path(source).name, lambda fh: shutil.copyfileobj(src, fh))
        return
    build = Path(tempfile.mkdtemp(prefix=".mldist-wheel-", dir=house))
    try:
        _run(wheel_argv(python, source, str(build)), f"building the mldist wheel from {source}")
        wheels = sorted(build.glob("mldist-*.whl"))
        if len(wheels) != 1:
            raise LaunchError(f"building the mldist wheel from {source} gave {[w.name for w in build.iterdir()]}")
        os.replace(wheels[0], house / wheels[0].name)
        fsync_dir(house)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def fill_wheelhouse(
    house: Wheelhouse,
    source: str,
    target: str,
    requirements: str | None = None,
    constraints: str | None = None,
    python: str = sys.executable,
) -> None:
    """Put every wheel the build job installs into ``house`` (on this node, with its network).

    Args:
        house: where, and for which Python and platform.
        source: ``--source``: a source tree or wheel (its wheel is added), or a requirement.
        target: what the job installs (:func:`wheelhouse_source` with the extra).
        requirements: a requirements file, if any.
        constraints: a constraints file, if any.
        python: the Python whose pip builds and downloads.
    """
    folder = make_dirs(house.path)
    if source.startswith("/"):
        _add_own_wheel(python, source, folder)
    print(f"mldist build-env: downloading wheels for {target} into {folder}", flush=True)
    what = f"pip download into {folder} (a package without a wheel for the nodes' Python and platform?)"
    _run(download_argv(python, house, target, requirements, constraints), what)
