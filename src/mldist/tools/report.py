"""The ``mldist env`` report: what detection sees and what ``init`` would set.

It is the text users paste into a bug report, so it never fails: a
problem becomes an ``error`` entry in the report instead of a traceback.
Nor does it show secrets: variables whose names look secret (``*TOKEN*``,
``*SECRET*``, ``*PASSWORD*``, ``*AUTH*``, ``*_KEY``) read ``<redacted>``, and so does
the ``user:password@`` part of proxy URLs. TensorFlow's start-up notices, which its
libraries print once each while it loads, are left out (its other messages are not).

Example:
    >>> r = build_report({}, with_tensorflow=False)
    >>> r["placement"]["launcher"], r["placement"]["size"]
    ('none', 1)
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import os
import platform
import socket
import sys
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

from ..base import envvalues
from ..base.procs import STARTUP_NOISE
from ..base.secrets import redact
from ..errors import ConfigError, MldistError
from ..placement import Placement, backend, build_cluster_spec, detect, handed, hierarchy
from ..placement.engines import LAUNCHER, Handed, decide, requested_engine
from ..placement.proxies import worker_no_proxy
from ..placement.resources import cpu_probe, openmp_defaults, physical_gpu_id, thread_plan
from ..runtime.engines.engine import mpi_allgather_hosts
from ..runtime.start.worker import gather_here

#: Variables worth showing when set, by whole name. TensorFlow's are named one by one: a ``TF_``
#: prefix would also take Terraform's (TF_CLI_CONFIG_FILE, TF_VAR_*, TF_LOG).
SHOWN_NAMES = frozenset(
    {
        "TF_CONFIG",
        "TF_CPP_MIN_LOG_LEVEL",
        "TF_CPP_MAX_VLOG_LEVEL",
        "TF_CPP_VMODULE",
        "TF_ENABLE_ONEDNN_OPTS",
        "TF_FORCE_GPU_ALLOW_GROWTH",
        "TF_GPU_ALLOCATOR",
        "TF_GPU_THREAD_MODE",
        "TF_GPU_THREAD_COUNT",
        "TF_XLA_FLAGS",
        "TF_NUM_INTRAOP_THREADS",
        "TF_NUM_INTEROP_THREADS",
        "TF_DETERMINISTIC_OPS",
        "TF_CUDNN_DETERMINISTIC",
        "TF_USE_LEGACY_KERAS",
        "TF_ENABLE_AUTO_MIXED_PRECISION",
        "XLA_FLAGS",
        "KERAS_BACKEND",
        "KERAS_HOME",
        "CUDA_VISIBLE_DEVICES",
        "no_proxy",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
        "grpc_proxy",
    }
)
#: Families shown when set, by prefix: each belongs to one launcher, library or runtime.
SHOWN_PREFIXES = (
    envvalues.PREFIX,
    "SLURM_",
    "OMPI_COMM_WORLD_",
    "OMPI_MCA_",
    "PMI_",
    "PALS_",
    "ALPS_",
    "PBS_",
    "COBALT_",
    "OMP_",
    "KMP_",
    "NCCL_",
    "FI_",
    "MPICH_",
    "HOROVOD_",
    "JAX_",
)


def shown(name: str) -> bool:
    """Whether ``mldist env`` lists variable ``name`` (:data:`SHOWN_NAMES`, :data:`SHOWN_PREFIXES`).

    Example:
        >>> [shown(n) for n in ("TF_CONFIG", "TF_CLI_CONFIG_FILE", "XLA_FLAGS", "FI_PROVIDER", "HOME")]
        [True, False, True, True, False]
    """
    return name in SHOWN_NAMES or name.startswith(SHOWN_PREFIXES)


_PACKAGES = (
    "mldist",
    "tensorflow",
    "tensorflow-cpu",
    "keras",
    "tf-keras",
    "jax",
    "jaxlib",
    "tensorboard",
    "mpi4py",
    "numpy",
)


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


@contextlib.contextmanager
def _without_startup_notices() -> Iterator[None]:
    """Hold this process's stderr (fd 2) in a file meanwhile; then pass on all but TensorFlow's start-up notices.

    The notices come from TensorFlow's C++ libraries, which write to fd 2 directly (two of them
    print the same ones), so only the descriptor can catch them.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = b"".join(line for line in held if not STARTUP_NOISE.search(line))
            sys.stderr.buffer.write(kept)
            sys.stderr.flush()


def _gpus(env: Mapping[str, str]) -> list[dict[str, str]]:
    with _without_startup_notices():
        import tensorflow as tf

        found = tf.config.list_physical_devices("GPU")
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    return [{"index": str(i), "name": d.name, "device_id": physical_gpu_id(i, cvd)} for i, d in enumerate(found)]


def build_report(env: Mapping[str, str], with_tensorflow: bool = True) -> dict[str, Any]:
    """Everything ``mldist env`` shows, as a JSON-ready dict.

    Args:
        env: the environment to analyse.
        with_tensorflow: also ask TensorFlow for GPUs (imports it: ~4 s).
    """
    report: dict[str, Any] = {"host": socket.gethostname(), "versions": _versions()}
    report["variables"] = {k: redact(k, v) for k, v in sorted(env.items()) if shown(k)}
    errors: list[str] = []
    try:
        placement = detect(env)
        report["placement"] = dataclasses.asdict(placement)
        spec = build_cluster_spec(placement, env, mpi_allgather_hosts)
        report["workers"] = list(spec.workers) if spec.size > 1 else []
        probe = cpu_probe(env)
        plan = thread_plan(env, spec.local_size, probe, size=spec.size)  # the very function init() uses
        report["threads"] = dataclasses.asdict(plan) | {"node_cpus": probe.total, "affinity_cpus": len(probe.allowed)}
        would = openmp_defaults(plan, probe.pinned)
        would |= worker_no_proxy(env, spec.workers)
        report["init_would_set"] = {k: redact(k, v) for k, v in would.items() if not env.get(k)}
    except MldistError as exc:
        errors.append(str(exc))
    if with_tensorflow:
        try:
            report["gpus"] = _gpus(env)
        except ImportError:
            errors.append("TensorFlow is not installed: pip install 'mldist[cpu]' (or [gpu])")
    report["keras_backend"] = backend.described(env)
    if refused := backend.refusal(env):  # what mldist run would say of it
        report["keras_backend_refused"] = refused
        errors.append(refused)
    try:
        given = handed.handed_in(env)  # decoded once: the engine's lines below take it from here
        mangled = []
    except ConfigError as exc:  # init() refuses a launcher's decision it cannot read
        given, mangled = None, [str(exc)]
    if "placement" in report:
        report["engine"] = _engine(env, placement, bool(report.get("gpus")), given)
    report["refused"] = [*envvalues.problems(env), *mangled, *([refused] if refused else [])]
    report["errors"] = errors + [line for line in report["refused"] if line not in errors]
    return report


def _engine(env: Mapping[str, str], placement: Placement, has_gpu: bool, given: Handed | None = None) -> dict[str, str]:
    """The engine ``init`` would choose (the same function decides), the MPI library behind it, why,
    and who decided: the launcher that handed its decision (``given``: ``mldist run``, or the job script
    of ``mldist submit``), or this process.

    MPI is joined only where ``init`` would join it (2+ ranks under an MPI launcher).
    """
    # What was asked, as given: a value that fails the check below is shown too.
    asked = envvalues.COMMUNICATION.read(env) or "auto"
    out = {"requested": asked, "choice": "none (one process)", "mpi_library": "", "reason": "", "decided": ""}
    try:
        out["requested"] = requested_engine(None, env)
        if placement.size == 1:
            return out
        decision = decide(gather_here(placement, out["requested"], has_gpu, given, env))
        out |= {"choice": decision.name, "reason": decision.reason, "mpi_library": decision.library}
        out["decided"] = handed.provenance(decision, given is not None, given.by if given else LAUNCHER)
        out |= {"allreduce": _tiers(env, placement)} if decision.mpi_world else {}
    except MldistError as exc:
        out |= {"choice": "error", "reason": str(exc)}
    return out


def _tiers(env: Mapping[str, str], placement: Placement) -> str:
    """The MPI engine's all-reduce on this placement: flat, or hierarchical over nodes (the engine asks MPI)."""
    try:
        return hierarchy.tiers(hierarchy.requested(env), *hierarchy.shape(placement)).said
    except ConfigError as exc:
        return f"error: {exc}"


def format_report(report: Mapping[str, Any]) -> str:
    """The report as aligned plain text."""
    lines = [f"host      {report['host']}"]
    lines += [f"version   {k} {v}" for k, v in report["versions"].items()]
    p = report.get("placement")
    if p:
        node = f", node {p['node_index']}" if p.get("node_index") is not None else ""  # unknown: not shown
        lines.append(
            f"launcher  {p['launcher']}: rank {p['rank']} of {p['size']}, "
            f"local {p['local_rank']} of {p['local_size']}{node}"
        )
        if p.get("hosts"):
            lines.append(f"hosts     {','.join(p['hosts'])}")
    for rank, addr in enumerate(report.get("workers", [])):
        lines.append(f"worker    {rank:>4} {addr}")
    t = report.get("threads")
    if t:
        set_by = f" ({t['overrides']})" if t.get("overrides") else ""
        lines.append(
            f"threads   {t['cpus']} cpus ({t['source']}): intra-op {t['intra_op']}, inter-op {t['inter_op']}{set_by}"
        )
        lines += [f"note      {t['note']}"] if t.get("note") else []
    for g in report.get("gpus", []):
        lines.append(f"gpu       {g['index']} {g['name']} (device {g['device_id']})")
    if "gpus" in report and not report["gpus"]:
        lines.append("gpu       none visible")
    refused = " - mldist run and init() refuse it (see the error below)" if report.get("keras_backend_refused") else ""
    lines += [f"backend   keras on {report['keras_backend']}{refused}"] if "keras_backend" in report else []
    lines += [f"init sets {k}={v}" for k, v in report.get("init_would_set", {}).items()]
    lines += [f"env       {k}={v}" for k, v in report["variables"].items()]
    e = report.get("engine")
    if e:
        lines.append(
            f"engine    {e['choice']} (asked: {e['requested']})" + (f" - {e['reason']}" if e["reason"] else "")
        )
        lines += [f"mpi       {e['mpi_library']}"] if e["mpi_library"] else []
        lines += [f"decided   {e['decided']}"] if e.get("decided") else []
        lines += [f"allreduce {e['allreduce']}"] if e.get("allreduce") else []
    lines += [f"error     {e}" for e in report["errors"]]
    return "\n".join(lines)
