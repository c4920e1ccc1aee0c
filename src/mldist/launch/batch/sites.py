"""Site profiles: a machine's scheduler, geometry and environment, in TOML.

Profiles come from, in increasing priority: the built-in ones below (from
centre documentation; verify against your site), ``~/.config/mldist/sites.toml``
and ``./mldist-sites.toml``. Command-line options override a profile.

A profile sets any ``mldist submit`` option by its Python name (``cores_per_node``,
``tasks_per_node``, ``hyperthreads``, ``launcher``, ``module_purge``, ``mem``,
``mem_per_cpu``, ``gpu_request``, ``env``, ...), plus ``partitions`` (the queue for
CPU-only and for GPU jobs) and ``extends`` (start from another profile; its
``env`` and ``partitions`` tables are merged, other options replaced).

Example file::

    [sites.mycluster]
    extends = "polaris"
    queue = "gpu"
    modules = ["cuda/12.4", "python/3.11"]
    unset = ["http_proxy", "https_proxy"]
    [sites.mycluster.env]
    NCCL_SOCKET_IFNAME = "ib0"
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from .spec import spec_fields

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser from PyPI (a declared dependency there)
    import tomli as tomllib

_LIBFABRIC = {
    "FI_CXI_DISABLE_HOST_REGISTER": "1",
    "FI_MR_CACHE_MONITOR": "userfaultfd",
    "FI_CXI_DEFAULT_CQ_SIZE": "131072",
}

#: Built-in profiles, from the centres' user documentation (2024-2026); verify against your site.
BUILTIN: dict[str, dict[str, Any]] = {
    "polaris": {
        "scheduler": "pbs",
        "launcher": "pals",
        "gpus_per_node": 4,
        "tasks_per_node": 4,
        "cores_per_node": 32,
        "hyperthreads": 2,  # mpiexec --depth 16 for 4 ranks, as the guide
        "module_purge": False,
        "directives": ["-l filesystems=home:eagle"],
        "env": {
            "NCCL_NET_GDR_LEVEL": "PHB",
            "NCCL_CROSS_NIC": "1",
            "NCCL_COLLNET_ENABLE": "1",
            "NCCL_NET": "AWS Libfabric",
            "TMPDIR": "/tmp",
            **_LIBFABRIC,
        },
    },
    "aurora": {
        "scheduler": "pbs",
        "env": {
            "CCL_PROCESS_LAUNCHER": "pmix",
            "CCL_ATL_TRANSPORT": "mpi",
            "CCL_KVS_MODE": "mpi",
            "FI_MR_CACHE_MONITOR": "userfaultfd",
        },
    },
    "alps": {
        "scheduler": "slurm",
        "gpus_per_node": 4,
        "tasks_per_node": 4,
        "env": {
            "NCCL_NET": "AWS Libfabric",
            "NCCL_NET_GDR_LEVEL": "PHB",
            "NCCL_CROSS_NIC": "1",
            "NCCL_PROTO": "^LL128",
            "FI_CXI_DEFAULT_TX_SIZE": "16384",
            "FI_CXI_RX_MATCH_MODE": "software",
            **_LIBFABRIC,
        },
    },
    "frontier": {
        "scheduler": "slurm",
        "gpus_per_node": 8,
        "tasks_per_node": 8,
        "cpus_per_task": 7,
        "env": {"NCCL_SOCKET_IFNAME": "hsn0,hsn1,hsn2,hsn3", "MIOPEN_USER_DB_PATH": "/tmp/miopen-cache"},
    },
    "perlmutter": {
        "scheduler": "slurm",
        "gpus_per_node": 4,
        "tasks_per_node": 4,
        "constraint": "gpu",
        "env": {"FI_MR_CACHE_MONITOR": "userfaultfd"},
    },
    "saga": {
        # Sigma2 Saga: GPUs one per rank on the accel partition, memory per CPU.
        "scheduler": "slurm",
        "partitions": {"cpu": "normal", "gpu": "accel"},
        "gpu_request": "task",
        # A count, not whole nodes: --mem-per-cpu times a whole node's CPUs would exceed its memory.
        "cpus_per_task": 6,
        "mem_per_cpu": "8G",
        "module_purge": True,
        "env": {"OMPI_MCA_btl": "^openib", "OMPI_MCA_pml": "ob1"},
    },
    "theta": {
        # ALCF Theta (KNL, 64 cores): 4 ranks per node, aprun -d 32 -j 2 -cc depth, OMP_NUM_THREADS=32.
        # No module purge: it would unload the Cray programming environment aprun and mpi4py need.
        "scheduler": "cobalt",
        "launcher": "aprun",
        "tasks_per_node": 4,
        "cores_per_node": 64,
        "hyperthreads": 2,
        "module_purge": False,
        "constraint": "mcdram=cache:numa=quad",
        "env": {"KMP_BLOCKTIME": "0", "KMP_AFFINITY": "granularity=fine,compact,1,0"},
    },
    "thetagpu": {
        # ALCF ThetaGPU (DGX A100: 8 GPUs, 128 cores): Cobalt qsub, Open MPI mpirun -np 8 per node.
        "scheduler": "cobalt",
        "launcher": "openmpi",
        "queue": "full-node",
        "gpus_per_node": 8,
        "tasks_per_node": 8,
        "cores_per_node": 128,
        "module_purge": False,
    },
    "apptainer-slurm": {
        "scheduler": "slurm",
        "unset": ["http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"],
    },
}

#: Options only a profile has: the queue per kind of job, and the profile it starts from.
PROFILE_ONLY = ("partitions", "extends")
_KEYS = (set(spec_fields()) - {"mldist_path", "stage_path"}) | set(PROFILE_ONLY)


def site_files(env: Mapping[str, str], cwd: Path) -> list[Path]:
    """The profile files looked at, lowest priority first."""
    config = Path(env.get("XDG_CONFIG_HOME") or Path(env.get("HOME", "~")).expanduser() / ".config")
    return [config / "mldist" / "sites.toml", cwd / "mldist-sites.toml"]


#: What each profile option must hold, by TOML type; every other option is a string.
_INTS = ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "hyperthreads", "grace", "cores_per_node")
_LISTS = ("directives", "modules", "binds", "unset", "wrap", "env_source", "container_args")
_BOOLS = ("requeue", "module_purge", "stage_env")


def _kind_error(key: str, value: Any) -> str | None:
    """What is wrong with ``key = value`` in a profile, or None."""
    if key in _INTS:
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 100_000
        return None if ok else f"{key} must be a whole number from 0 to 100000, e.g. {key} = 4"
    if key in _LISTS:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        return None if ok else f'{key} must be a list of strings, e.g. {key} = ["a", "b"]'
    if key == "env":
        ok = isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        return None if ok else "env must be a table of strings"
    if key == "partitions":
        ok = (
            isinstance(value, dict) and set(value) <= {"cpu", "gpu"} and all(isinstance(v, str) for v in value.values())
        )
        return None if ok else 'partitions must be a table like {cpu = "normal", gpu = "accel"}'
    if key in _BOOLS:
        return None if isinstance(value, bool) else f"{key} must be true or false"
    return None if isinstance(value, str) else f'{key} must be a string, e.g. {key} = "..."'


def _check_profile(name: str, profile: Mapping[str, Any], source: str) -> dict[str, Any]:
    unknown = sorted(set(profile) - _KEYS)
    if unknown:
        raise ConfigError(
            f"site {name!r} in {source}: unknown option {unknown[0]!r}; known: {', '.join(sorted(_KEYS))}"
        )
    for key, value in profile.items():
        problem = _kind_error(key, value)
        if problem:
            raise ConfigError(f"site {name!r} in {source}: {problem} (got {value!r})")
    return dict(profile)


def load_sites(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> dict[str, dict[str, Any]]:
    """All profiles by name: built-in, then user file, then project file.

    Example:
        >>> load_sites({"HOME": "/nonexistent"}, Path("/nonexistent"))["polaris"]["scheduler"]
        'pbs'
    """
    env = os.environ if env is None else env
    sites = {name: dict(p) for name, p in BUILTIN.items()}
    for path in site_files(env, cwd or Path.cwd()):
        if not path.is_file():
            continue
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"site file {path} cannot be read: {exc}") from None
        _check_layout(data, path)
        tables = data.get("sites", {})
        if not isinstance(tables, dict):
            raise ConfigError(f"site file {path}: 'sites' must be a table of [sites.NAME] tables")
        for name, profile in tables.items():
            if not isinstance(profile, dict):
                raise ConfigError(f"site file {path}: [sites.{name}] must be a table")
            sites[name] = _check_profile(name, profile, str(path))
    return {name: _resolve(name, sites, ()) for name in sites}


def _check_layout(data: Mapping[str, Any], path: Path) -> None:
    """A site file holds only ``[sites.NAME]`` tables: anything else at the top would be silently unread.

    Example:
        >>> try:
        ...     _check_layout({"mysite": {"scheduler": "slurm"}}, Path("mldist-sites.toml"))
        ... except ConfigError as exc:
        ...     print(str(exc).split(": ", 1)[1])
        [mysite] is not read: each profile is a [sites.NAME] table; write [sites.mysite]
    """
    for key, value in data.items():
        if key == "sites":
            continue
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            hint = f"write [sites.{next(iter(value))}]"  # [site.mysite], [profiles.mysite]: one level too many
        elif isinstance(value, dict):
            hint = f"write [sites.{key}]"
        else:
            hint = "move it under a [sites.NAME] header"
        shown = f"[{key}]" if isinstance(value, dict) else f"{key!r}"
        raise ConfigError(f"site file {path}: {shown} is not read: each profile is a [sites.NAME] table; {hint}")


#: Tables an extending profile merges with its base's (other options replace).
_MERGED = ("env", "partitions")


def _resolve(name: str, sites: Mapping[str, Mapping[str, Any]], seen: tuple[str, ...]) -> dict[str, Any]:
    """Profile ``name`` with its ``extends`` chain applied."""
    profile = dict(sites[name])
    base_name = profile.pop("extends", None)
    if base_name is None:
        return profile
    if base_name in (*seen, name):
        raise ConfigError(f"site {name!r}: extends forms a loop ({' -> '.join((*seen, name, base_name))})")
    if base_name not in sites:
        raise ConfigError(
            f"site {name!r} extends {base_name!r}, which is not defined; known: {', '.join(sorted(sites))}"
        )
    merged = _resolve(base_name, sites, (*seen, name))
    for key, value in profile.items():
        merged[key] = {**merged.get(key, {}), **value} if key in _MERGED else value
    return merged


def site_profile(name: str, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> dict[str, Any]:
    """One profile by name, or a ConfigError listing the known names."""
    sites = load_sites(env, cwd)
    if name not in sites:
        raise ConfigError(f"--site {name!r} is not defined; known sites: {', '.join(sorted(sites))}")
    return sites[name]
