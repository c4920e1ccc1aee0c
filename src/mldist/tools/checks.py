"""The machine and job checks of ``mldist doctor`` beyond the network: CPU, TensorFlow, GPUs, MPI, ports, files.

Each takes the environment and returns a :class:`~mldist.tools.doctor.Check`-like tuple
``(name, status, message, fix)``. TensorFlow is probed in a subprocess, so an
"Illegal instruction" crash (a TensorFlow built for CPU features the login node
lacks) is reported, not suffered.

Example::

    name, status, message, fix = check_cpu_features(os.environ)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..base import envvalues
from ..errors import MldistError
from ..placement import build_cluster_spec, detect, no_discovery
from ..placement.proxies import proxy_settings

Result = tuple[str, str, str, str]
_PROBE = (
    "import json, tensorflow as tf; print(json.dumps({'cuda': tf.test.is_built_with_cuda(), "
    "'gpus': len(tf.config.list_physical_devices('GPU')), 'version': tf.__version__}))"
)


def cpu_flags(cpuinfo: str) -> set[str]:
    """The CPU feature flags in ``/proc/cpuinfo`` text.

    Example:
        >>> sorted(cpu_flags("processor : 0\\nflags : fpu sse avx\\n"))
        ['avx', 'fpu', 'sse']
    """
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def tensorflow_probe(timeout: float = 120) -> tuple[dict[str, object] | None, str]:
    """What a fresh process learns by importing TensorFlow, or why it could not."""
    try:
        res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"importing TensorFlow took over {timeout:g} s"
    if res.returncode == -signal.SIGILL:
        return None, "SIGILL"
    lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
    if res.returncode != 0 or not lines:
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"importing TensorFlow failed: {tail}"
    return json.loads(lines[-1]), ""


def check_cpu_and_tensorflow(env: Mapping[str, str]) -> list[Result]:
    """The CPU's features against what TensorFlow needs, and TensorFlow's build (CUDA) and GPUs."""
    flags = cpu_flags(Path("/proc/cpuinfo").read_text()) if Path("/proc/cpuinfo").is_file() else set()
    results: list[Result] = []
    if flags and "avx" not in flags and os.uname().machine == "x86_64":
        results.append(
            (
                "CPU features",
                "fail",
                "this CPU has no AVX; TensorFlow's x86 wheels need it",
                "run on a compute node, or use a TensorFlow built for this CPU",
            )
        )
    info, why = tensorflow_probe()
    if why == "SIGILL":
        fix = "this node's CPU lacks instructions the build uses (AVX/AVX512): run on a compute node"
        results.append(("TensorFlow", "fail", "importing TensorFlow crashed with Illegal instruction (SIGILL)", fix))
        return results
    if info is None:
        return [*results, ("TensorFlow", "fail", why, "pip install 'mldist[cpu]' (or [gpu])")]
    results.append(("TensorFlow", "ok", f"TensorFlow {info['version']} imports", ""))
    results.append(_gpu_result(env, bool(info["cuda"]), int(str(info["gpus"]))))
    return [*results, *_jax_result(env)]


def check_keras_backend(env: Mapping[str, str]) -> list[Result]:
    """A fail when ``mldist run`` and ``init()`` would refuse the Keras backend (the same check); else nothing."""
    from ..placement import backend

    if refused := backend.refusal(env):
        return [("Keras backend", "fail", refused, "set KERAS_BACKEND=tensorflow or jax (or 'backend' in keras.json)")]
    return []


def _jax_result(env: Mapping[str, str]) -> list[Result]:
    """JAX's and jaxlib's versions beside TensorFlow's (package metadata: no import); a fail where the
    configured Keras backend needs them and they are missing."""
    import importlib.metadata

    from ..placement import backend

    found = {}
    for name in ("jax", "jaxlib"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    try:
        keras = backend.keras_backend(env, backend.read_config(env))
        needed = backend.traits(keras).packages
    except MldistError:
        keras, needed = "", ()
    if missing := [name for name in needed if name not in found]:
        why = f"KERAS_BACKEND={keras} but {' and '.join(missing)} not installed"
        return [("JAX", "fail", why, "pip install 'mldist[jax]'")]
    if found:
        return [("JAX", "ok", " and ".join(f"{name} {version}" for name, version in found.items()) + " installed", "")]
    return []


def _gpu_result(env: Mapping[str, str], cuda: bool, gpus: int) -> Result:
    try:
        tasks = detect(env).local_size
    except MldistError:
        tasks = 1
    if gpus == 0:
        if shutil.which("nvidia-smi") and not cuda:
            return (
                "GPUs",
                "warn",
                "this node has nvidia-smi but TensorFlow is not built with CUDA",
                "pip install 'mldist[gpu]'",
            )
        return ("GPUs", "ok", "no GPU visible: CPU training (MPI or RING engine)", "")
    if gpus < tasks:
        return (
            "GPUs",
            "warn",
            f"{gpus} GPU(s) visible for {tasks} tasks on this node: tasks would share GPUs",
            f"start {gpus} tasks per node (--tasks-per-node {gpus})",
        )
    if tasks == 1 and gpus > 1:
        return (
            "GPUs",
            "warn",
            f"{gpus} GPUs visible but one task on this node: one GPU would be used",
            f"start {gpus} tasks per node, or use mldist.strategy().scope()",
        )
    nccl = _nccl_found()
    if not nccl:
        return (
            "GPUs",
            "warn",
            f"{gpus} GPU(s), but no NCCL library found",
            "pip install nvidia-nccl-cu12, or set MLDIST_COMMUNICATION=ring",
        )
    return ("GPUs", "ok", f"{gpus} GPU(s) for {tasks} task(s); NCCL found", "")


def _nccl_found() -> bool:
    import ctypes.util

    if ctypes.util.find_library("nccl"):
        return True
    try:
        import nvidia.nccl  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return False
    return True


def check_proxies(env: Mapping[str, str]) -> list[Result]:
    """HTTP proxies and gRPC: whether ``mldist.init()`` will keep the workers' traffic off them."""
    proxies = [k for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy") if env.get(k)]
    if not proxies:
        return [("proxies", "ok", "no HTTP proxy set", "")]
    try:
        spec = build_cluster_spec(detect(env), env, no_discovery)
        hosts = sorted({w.rpartition(":")[0] for w in spec.workers})
    except MldistError:
        hosts = []
    added = proxy_settings(env, hosts)
    message = (
        f"{', '.join(proxies)} set; mldist.init() adds the workers to no_proxy"
        if added
        else (f"{', '.join(proxies)} set; the workers are already in no_proxy")
    )
    return [("proxies", "ok", message, "")]


def directory_problem(path: Path) -> str:
    """Why no files can be written in directory ``path`` (made if missing), in words; "" when they can.

    Tried, not guessed from permission bits (root passes those, /proc refuses anyway): a directory
    made and removed again in ``path``, or in the nearest folder above it that exists.

    Example:
        >>> import tempfile
        >>> directory_problem(Path(tempfile.mkdtemp()) / "runs"), directory_problem(Path("/dev/null/runs"))
        ('', '/dev/null is a file, so /dev/null/runs cannot be made below it')
    """
    if path.exists() and not path.is_dir():
        return f"{path} is a file, not a directory"
    if path.is_symlink() and not path.exists():
        return f"{path} is a broken symbolic link (to {os.readlink(path)})"
    above = path
    while not above.exists() and not above.is_symlink() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"{above} is a file, so {path} cannot be made below it"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".mldist-doctor-", dir=above))
    except OSError as exc:
        made = "" if above == path else f", so {path} cannot be made"
        return f"nothing can be written in {above} ({exc.strerror}){made}"
    return ""


def check_files(env: Mapping[str, str]) -> list[Result]:
    """The run directory (``MLDIST_RUN_DIR``; else ``MLDIST_RUNS_DIR`` or ``runs``, where run directories
    are made) can be written, and this rank's port is free."""
    from ..runtime.engines.tf_engine import check_port_free

    results: list[Result] = []
    named = ((s.name, value) for s in (envvalues.RUN_DIR, envvalues.RUNS_DIR) if (value := s.read(env)))
    name, value = next(named, ("", "runs"))
    path = Path(value).absolute()
    if problem := directory_problem(path):
        given = f"{name}={value}: " if name else ""
        fix = f"set {name} to a writable directory" if name else "run from a writable directory or pass --run-dir"
        results.append(("run directory", "fail", f"{given}{problem}", fix))
    else:
        made = "is writable" if path.is_dir() else "can be made"
        results.append(("run directory", "ok", f"{path} {made}", ""))
    try:
        spec = build_cluster_spec(detect(env), env, no_discovery)
        if spec.size > 1:
            check_port_free(spec.address)
            results.append(("ports", "ok", f"this rank's port ({spec.address}) is free", ""))
    except MldistError as exc:
        results.append(("ports", "fail", str(exc), "set MLDIST_PORT_BASE to a free range"))
    return results


def check_datasets(env: Mapping[str, str]) -> list[Result]:
    """Which datasets the cache holds (compute nodes often have no internet to fetch them)."""
    from ..data.datasets import DATASETS, cache_dir, status

    root = cache_dir(envvalues.DATA_DIR.read(env))
    states = {name: status(ds, root).status for name, ds in DATASETS.items()}
    ready = sorted(n for n, s in states.items() if s in ("verified", "pinned", "unverified"))
    if ready:
        return [("datasets", "ok", f"cached in {root}: {', '.join(ready)}", "")]
    first = "mnist" if "mnist" in states else sorted(states)[0]
    return [
        (
            "datasets",
            "warn",
            f"no dataset cached in {root}",
            f"on a login node: mldist data fetch {first} (compute nodes may have no internet)",
        )
    ]
