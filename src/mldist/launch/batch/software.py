"""The software environment of a batch job, as script lines: modules, sources, venv, variables, container.

Pure: a spec in, lines out; every value the user gave is quoted with
``shlex`` (``--env`` values through :mod:`.expand`, so ``$NAME`` expands when
the job starts and nothing else does). Order matters and follows the guides:
modules (``module purge`` only when asked: on Cray systems it unloads the
programming environment ``aprun`` and mpi4py need), then ``--env-source``
files, the venv or conda environment, the thread plan, the ``--env`` values
(after the modules, so ``${CUDA_PATH}`` is the module's), and last the
container image, pulled once per job (a job-time pull comes before any ``unset``
of the proxies: see ``render``).

Example:
    >>> from mldist.launch.batch.spec import JobSpec
    >>> spec = JobSpec(command=("python",), env=(("LD_LIBRARY_PATH", "$LD_LIBRARY_PATH:/opt/v"),))
    >>> env_lines(spec)[-1]
    'export LD_LIBRARY_PATH="${LD_LIBRARY_PATH-}":/opt/v'
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

from ...base import envvalues
from .expand import references, shell_word
from .launchers import Raw, Shell
from .spec import JobSpec

q = shlex.quote

#: Where the submitting mldist is bound in a container that has none (on PYTHONPATH there).
HOST_MLDIST = "/opt/mldist-host"
#: The job directory, as the script refers to it.
JOB_DIR = envvalues.shell("$@JOB_DIR@")


def not_an_option(path: str) -> str:
    """``path``, made unreadable as an option (a relative ``-venv`` becomes ``./-venv``)."""
    return "./" + path if path.startswith("-") else path


def module_lines(s: JobSpec) -> list[str]:
    """``module purge`` (when asked) and ``module load`` lines, with the module command made available."""
    if not (s.modules or s.module_purge):
        return []
    return [
        "if ! command -v module >/dev/null 2>&1; then",
        '  for f in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh; do [ -r "$f" ] && . "$f"; done',
        "fi",
        *(["module purge"] if s.module_purge else []),
        *(f"module load {q(m)}" for m in s.modules),
    ]


def source_lines(s: JobSpec) -> list[str]:
    """Source each ``--env-source`` file (vendor scripts may read unset variables: ``set +u`` around them)."""
    lines = []
    for path in s.env_source:
        f = q(not_an_option(path))
        lines += [
            f'[ -r {f} ] || {{ echo "mldist: --env-source {path!r} is not readable on $(hostname)" >&2; exit 1; }}',
            f"set +u; source {f}; set -u",
        ]
    return lines


def network_lines(s: JobSpec) -> list[str]:
    """The network between the nodes (``--network-interface``): Open MPI's TCP transport and launcher,
    and NCCL's sockets when it is an interface name (NCCL takes no CIDR)."""
    if not s.network_interface:
        return []
    iface = q(s.network_interface)
    lines = [f"export OMPI_MCA_btl_tcp_if_include={iface} PRTE_MCA_oob_tcp_if_include={iface}"]
    return lines + ([f"export NCCL_SOCKET_IFNAME={iface}"] if "/" not in s.network_interface else [])


def env_lines(s: JobSpec) -> list[str]:
    """``export`` of the ``--env`` values; ``$NAME`` in a value expands here, once (a note if it is unset)."""
    lines = [*network_lines(s)]
    if s.tf_config:
        lines.append(
            envvalues.shell("export @TF_CONFIG@=1  # each rank's TF_CONFIG (mldist's start-up hook writes it)")
        )
    for key, value in s.env:
        for name in references(value):
            lines.append(
                f'[ -n "${{{name}+x}}" ] || echo "mldist: --env {key} uses \\${name}, which is not set in the job"'
            )
        lines.append(f"export {key}={shell_word(value)}")
    return lines


def activate_lines(s: JobSpec) -> list[str]:
    """Activate the venv or conda environment."""
    if s.venv:
        return [f"source {q(not_an_option(s.venv.rstrip('/') + '/bin/activate'))}"]
    if s.conda:
        return ['eval "$(conda shell.bash hook)"', f"conda activate {q(s.conda)}"]
    return []


def sif_name(uri: str) -> str:
    """The file name a pulled image is kept under (the job's pull and the login node's).

    Example:
        >>> sif_name("docker://tensorflow/tensorflow:2.16.1-gpu")
        'tensorflow_tensorflow_2.16.1-gpu.sif'
    """
    return re.sub(r"[^A-Za-z0-9._-]+", "_", uri.split("://", 1)[1]).strip("_") + ".sif"


def image(s: JobSpec) -> str:
    """Where the SIF the ranks run is: the local path, or where a pulled image is kept."""
    assert s.container
    if not s.remote_image:
        return not_an_option(s.container)
    name = sif_name(s.container)
    return f"{s.container_cache.rstrip('/')}/{name}" if s.container_cache else f"{JOB_DIR}/{name}"


def container_prefix(s: JobSpec) -> list[str]:
    """``apptainer exec [--nv] --bind ... IMAGE`` (empty without a container)."""
    if not s.container:
        return []
    argv = ["apptainer", "exec"] + (["--nv"] if s.gpus_per_node else [])
    for path in ("$PWD", JOB_DIR, *s.binds):
        argv += ["--bind", Shell(path) if path in ("$PWD", JOB_DIR) else path]
    argv += [Raw('${mldist_binds[@]+"${mldist_binds[@]}"}'), *s.container_args]
    return [*argv, Shell("$mldist_sif") if s.remote_image else image(s)]


def container_lines(s: JobSpec, word: Callable[[str], str]) -> list[str]:
    """Cache directory, the pull (once per job, or once per cache), and mldist for an image without it.

    Args:
        s: the job.
        word: how the renderer writes one argv word (quoting).
    """
    if not s.container:
        return []
    lines = ['export APPTAINER_CACHEDIR="${APPTAINER_CACHEDIR:-${TMPDIR:-/tmp}/apptainer-cache-$(id -u)}"']
    if s.remote_image:
        where = image(s)
        sif = f'"{where}"' if where.startswith(f"{JOB_DIR}/") else q(where)
        lines += [
            f"mldist_sif={sif}",
            'if [ ! -s "$mldist_sif" ]; then  # pulled once; a requeued job (or a named cache) reuses it',
            '  mkdir -p "$(dirname "$mldist_sif")"',
            f'  apptainer pull --force "$mldist_sif.part-$$" {q(s.container)} && mv -f "$mldist_sif.part-$$" '
            f'"$mldist_sif" || {{ echo "mldist: cannot pull {s.container} (see above)" >&2; exit 1; }}',
            "fi",
        ]
    lines.append("mldist_binds=()")
    if s.mldist_path:
        probe = " ".join(word(a) for a in [*container_prefix(s), "python3", "-c", "import mldist"])
        lines += [
            f"if ! {probe} >/dev/null 2>&1; then",
            f"  echo 'mldist: the container has no mldist: binding' {q(s.mldist_path)} '(the mldist that "
            "submitted the job); install mldist in the image to use its own'",
            f"  mldist_binds=(--bind {q(s.mldist_path + ':' + HOST_MLDIST + '/mldist:ro')})",
            f'  export APPTAINERENV_PYTHONPATH="{HOST_MLDIST}${{PYTHONPATH:+:$PYTHONPATH}}"',
            "fi",
        ]
    return lines
