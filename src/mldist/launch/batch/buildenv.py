"""The ``mldist build-env`` job: the program that builds a virtual environment on a compute node.

Pure but for reading the file system and mldist's own install metadata: a build
request in, the job's argv out. The job runs a fixed bash program
(:data:`BUILD_SCRIPT`) as its one task; the venv path, what to install and the
requirements file and the wheelhouse reach it as ``"$1"`` ... ``"$6"``, never as shell code. The
centre guides' ``venv_build.job``: load the modules, ``python3 -m venv``, upgrade
pip, install mldist with the right TensorFlow, check the imports, record ``pip freeze``.

The job's directives, modules and environment come from ``mldist submit``'s own
options and profile handling (:func:`mldist.launch.batch.build.build_spec`), with one task.

Example:
    >>> build_command(BuildRequest(venv="/w/tf", source="mldist==0.1.0"))[4:7]
    ('/w/tf', 'mldist[cpu]==0.1.0', 'cpu')
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

from ..._version import __version__
from ...base import envvalues
from ...errors import ConfigError
from .render import redaction_sed

q = shlex.quote

#: Where the build records ``pip freeze``: in the venv, and in the job directory.
FREEZE_NAME = "mldist-build.txt"

# $1 venv, $2 what pip installs (with the extra), $3 cpu|gpu, $4 requirements file or "",
# $5 constraints file or "", $6 wheelhouse or "" (then pip never asks an index: the node may
# have no internet). {sed} becomes the shell-quoted redaction programs of render.py.
_TEMPLATE = """set -euo pipefail
venv="$1"; target="$2"; flavour="$3"; requirements="$4"; constraints="$5"; wheelhouse="${6:-}"
say() { printf "mldist build-env: %s\\n" "$*"; }
offline=()
if [ -n "$wheelhouse" ]; then
  [ -d "$wheelhouse" ] || { say "the wheelhouse $wheelhouse is not a directory on $(hostname)"; exit 2; }
  offline=(--no-index --find-links "$wheelhouse")
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  say "installing from the wheelhouse $wheelhouse only (no package index)"
fi
say "building $venv on $(hostname) with $(command -v python3) ($(python3 --version 2>&1))"
if [ -e "$venv/pyvenv.cfg" ]; then
  say "updating the existing venv $venv"
elif [ -e "$venv" ] && { [ ! -d "$venv" ] || [ -n "$(ls -A -- "$venv")" ]; }; then
  say "$venv exists and is not an empty directory or a venv; nothing done"; exit 2
else
  python3 -m venv -- "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install ${offline[@]+"${offline[@]}"} --upgrade pip
args=(install ${offline[@]+"${offline[@]}"} "$target")
if [ -n "$requirements" ]; then args+=(-r "$requirements"); fi
if [ -n "$constraints" ]; then args+=(-c "$constraints"); fi
say "pip ${args[*]}"
"$py" -m pip "${args[@]}"
check="import mldist, tensorflow"
case "$flavour" in cpu) check="$check, mpi4py" ;; jax*) check="$check, jax" ;; esac
"$py" -c "$check; print(\\"imports ok: mldist\\", mldist.__version__, \\"tensorflow\\", tensorflow.__version__)"
{
  echo "# mldist build-env: $venv on $(hostname) at $(date -u +%FT%TZ); modules: ${LOADEDMODULES:-none}"
  "$py" -m pip freeze
} | sed -E {sed} >"$venv/FREEZE"
cp -- "$venv/FREEZE" "$@JOB_DIR@/FREEZE"
say "done in ${SECONDS} s; pip freeze in $venv/FREEZE and $@JOB_DIR@/FREEZE"
"""

#: The job's one task: ``bash -c BUILD_SCRIPT mldist-build-env VENV TARGET FLAVOUR REQUIREMENTS CONSTRAINTS
#: WHEELHOUSE``.
BUILD_SCRIPT = (
    envvalues.shell(_TEMPLATE)
    .replace("{sed}", " ".join(f"-e {q(p)}" for p in redaction_sed()))
    .replace("FREEZE", FREEZE_NAME)
)

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?(.*)", re.DOTALL)


#: (Keras backend, GPU nodes) -> the extra that installs them.
EXTRAS = {
    ("tensorflow", False): "cpu",
    ("tensorflow", True): "gpu",
    ("jax", False): "jax",
    ("jax", True): "jax-cuda",
}


@dataclass(frozen=True)
class BuildRequest:
    """What to build.

    Args:
        venv: absolute path of the virtual environment (created, or updated if it is one).
        source: an absolute directory or wheel path, or a pip requirement such as ``mldist==0.1.0``.
        gpu: install the ``[gpu]`` extra (TensorFlow with CUDA) instead of ``[cpu]``.
        backend: "tensorflow", or "jax" for the ``[jax]`` / ``[jax-cuda]`` extras (Keras 3 on JAX).
        requirements: an absolute path of a requirements file installed with mldist.
        constraints: an absolute path of a pip constraints file.
        wheelhouse: an absolute directory of wheels the job installs from, with no package index.

    Example:
        >>> BuildRequest(venv="/w/tf", source="/src/mldist", gpu=True).flavour
        'gpu'
    """

    venv: str
    source: str
    gpu: bool = False
    requirements: str | None = None
    constraints: str | None = None
    wheelhouse: str | None = None
    backend: str = "tensorflow"

    def __post_init__(self) -> None:
        paths = (("--venv", self.venv), ("--requirements", self.requirements), ("--wheelhouse", self.wheelhouse))
        for what, value in paths:
            if value is not None and not value.startswith("/"):
                raise ConfigError(f"{what} {value!r} must be an absolute path")
        for what, value in (*paths, ("--source", self.source)):
            if value is not None and _CONTROL.search(value):
                raise ConfigError(f"{what} {value!r} holds a control character (newline, tab, ...); refused")
        if not self.source.strip():
            raise ConfigError("--source is empty: give a directory, a wheel or a requirement like mldist==0.1.0")

    @property
    def flavour(self) -> str:
        """The extra installed and the imports checked: ``cpu``, ``gpu``, ``jax`` or ``jax-cuda``."""
        return EXTRAS[(self.backend, self.gpu)]


def install_target(source: str, flavour: str) -> str:
    """What pip installs: ``source`` with the ``[cpu]``/``[gpu]`` extra unless it names extras already.

    Args:
        source: a path (starting with ``/`` or ``.``), a URL or a requirement.
        flavour: ``cpu`` or ``gpu``.

    Example:
        >>> install_target("/src/mldist", "cpu"), install_target("mldist>=0.1", "gpu")
        ('/src/mldist[cpu]', 'mldist[gpu]>=0.1')
        >>> install_target("git+https://example.org/mldist.git", "cpu")
        'mldist[cpu] @ git+https://example.org/mldist.git'
    """
    if source.startswith(("/", ".")):
        return source if source.endswith("]") else f"{source}[{flavour}]"
    if "://" in source and " @ " not in source:
        return f"mldist[{flavour}] @ {source}"
    m = _NAME.fullmatch(source)
    if not m or m.group(2):
        return source
    return f"{m.group(1)}[{flavour}]{m.group(3)}"


def check_venv_path(path: Path) -> None:
    """Refuse ``path`` unless it is missing, an empty directory or an existing venv (updated then).

    Args:
        path: the venv's path.

    Example:
        >>> check_venv_path(Path("/nonexistent/mldist-venv"))
    """
    if not path.exists() or (path / "pyvenv.cfg").is_file():
        return
    if not path.is_dir():
        raise ConfigError(f"--venv {str(path)!r} exists and is not a directory; choose a new path")
    if any(path.iterdir()):
        raise ConfigError(f"--venv {str(path)!r} is a non-empty directory but not a venv; choose a new or empty one")


def _direct_url_path(text: str | None) -> Path | None:
    """The local directory (or archive) a ``direct_url.json`` points at, if it still exists."""
    try:
        data = json.loads(text or "")
    except ValueError:
        return None
    url = urlparse(str(data.get("url", ""))) if isinstance(data, dict) else None
    if url is None or url.scheme != "file":
        return None
    path = Path(unquote(url.path))
    return path if path.exists() else None


def running_source(package_dir: Path | None = None) -> str:
    """Where the running mldist came from: its source tree, else ``mldist==<version>`` from the index.

    A source tree is what pip's ``direct_url.json`` names (editable or directory
    installs), or a ``pyproject.toml`` of mldist two levels above the package.

    Args:
        package_dir: the ``mldist`` package directory (default: this one).

    Example:
        >>> running_source(Path("/nonexistent/src/mldist")).startswith(("/", "mldist=="))
        True
    """
    try:
        found = _direct_url_path(metadata.distribution("mldist").read_text("direct_url.json"))
    except metadata.PackageNotFoundError:
        found = None
    if found is not None:
        return str(found)
    tree = (package_dir or Path(__file__).resolve().parents[2]).parents[1]
    pyproject = tree / "pyproject.toml"
    if pyproject.is_file() and 'name = "mldist"' in pyproject.read_text(encoding="utf-8", errors="replace"):
        return str(tree)
    return f"mldist=={__version__}"


def constraints_of(source: str) -> str | None:
    """The ``constraints.txt`` of a source tree, if ``source`` is one that has it.

    Example:
        >>> constraints_of("mldist==0.1.0") is None
        True
    """
    if not source.startswith("/"):
        return None
    path = Path(source) / "constraints.txt"
    return str(path) if path.is_file() else None


def build_command(req: BuildRequest) -> tuple[str, ...]:
    """The job's task argv: the fixed :data:`BUILD_SCRIPT` and the request as its arguments.

    Args:
        req: what to build.

    Example:
        >>> build_command(BuildRequest(venv="/w/tf", source="/src"))[3:]
        ('mldist-build-env', '/w/tf', '/src[cpu]', 'cpu', '', '', '')
    """
    target = install_target(req.source, req.flavour)
    extra = (req.requirements or "", req.constraints or "", req.wheelhouse or "")
    return ("bash", "-c", BUILD_SCRIPT, "mldist-build-env", req.venv.rstrip("/") or "/", target, req.flavour, *extra)


def follow_up(
    venv: str,
    modules: Sequence[str] = (),
    site: str | None = None,
    scheduler: str | None = None,
    module_purge: bool | None = None,
) -> str:
    """The ``mldist submit`` line that uses the built venv (same modules: the venv's Python needs them).

    Args:
        venv: the venv's path.
        modules: the modules the build loaded.
        site: the ``--site`` given, if any.
        scheduler: the ``--scheduler`` given, if any.
        module_purge: the ``--module-purge`` or ``--no-module-purge`` given, if any.

    Example:
        >>> follow_up("/w/my tf", ["python/3.11"])
        "mldist submit --venv '/w/my tf' --module python/3.11 --nodes 2 -- python train.py"
    """
    words = ["mldist", "submit"]
    words += ["--site", site] if site else []
    words += ["--scheduler", scheduler] if scheduler else []
    words += ["--venv", venv]
    words += [] if module_purge is None else ["--module-purge" if module_purge else "--no-module-purge"]
    for module in modules:
        words += ["--module", module]
    return " ".join(q(w) for w in words) + " --nodes 2 -- python train.py"
