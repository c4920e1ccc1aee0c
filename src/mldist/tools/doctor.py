"""``mldist doctor``: pre-flight checks, each ok, warn or fail with the fix.

Checks are a table: a name and a function of the environment returning a
:class:`Check`. The exit code is 0 when all are ok, 1 with warnings, 2 with
failures.

Example::

    results = run_checks(os.environ)
    print(format_checks(results)); raise SystemExit(exit_code(results))
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import MldistError
from ..placement import build_cluster_spec, detect, engines, handed, no_discovery
from ..placement.engines import gpu_device_nodes, requested_engine

STATUSES = ("ok", "warn", "fail")


@dataclass(frozen=True)
class Check:
    """One check's outcome: ``status`` is "ok", "warn" or "fail"; ``fix`` says what to do."""

    name: str
    status: str
    message: str
    fix: str = ""


def public_addresses(addresses: list[str]) -> list[str]:
    """The addresses that are globally routable (not loopback, private or link-local).

    Example:
        >>> public_addresses(["127.0.0.1", "10.1.2.3", "192.168.0.7", "8.8.8.8", "fe80::1"])
        ['8.8.8.8']
    """
    public = []
    for text in addresses:
        try:
            address = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            continue
        if address.is_global:
            public.append(text)
    return public


def _resolve(host: str) -> list[str]:
    try:
        return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None)})
    except OSError:
        return []


def check_worker_network(env: Mapping[str, str]) -> Check:
    """Warn when workers' addresses are public: TensorFlow's gRPC server (RING/NCCL) has no authentication."""
    try:
        spec = build_cluster_spec(detect(env), env, no_discovery)
        hosts = sorted({w.rpartition(":")[0] for w in spec.workers}) if spec.size > 1 else [socket.gethostname()]
    except MldistError as exc:
        return Check("worker network", "warn", f"cannot tell the workers' addresses ({exc})")
    addresses = sorted({a for host in hosts for a in _resolve(host)})
    public = public_addresses(addresses)
    if public:
        return Check(
            "worker network",
            "warn",
            f"worker address {', '.join(public)} is on a public interface: with the RING or NCCL engine anyone "
            "who reaches the port can run operations in the workers",
            "use the MPI engine (MLDIST_COMMUNICATION=mpi), or ask the site for a job-private network or "
            "firewalled compute-node ports",
        )
    shown = ", ".join(addresses) or "none resolved"
    return Check("worker network", "ok", f"worker addresses are private or loopback ({shown})")


def check_mpi(env: Mapping[str, str]) -> Check:
    """Which engine ``init`` would use here (decided as ``init`` decides), and whether MPI is possible."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return Check(
            "MPI engine",
            "warn",
            "mpi4py is not installed: CPU workers fall back to TensorFlow's RING engine",
            "pip install 'mldist[cpu]' (or build mpi4py against the site's MPI)",
        )
    from ..runtime.start.worker import gather_here

    try:
        placement = detect(env)
        if placement.size == 1:
            return Check("MPI engine", "ok", "mpi4py is importable (one process here: no collectives)")
        given = handed.handed_in(env)
        decision = engines.decide(gather_here(placement, requested_engine(None, env), gpu_device_nodes(), given, env))
    except MldistError as exc:
        return Check("MPI engine", "fail", str(exc), "fix the MPI installation, or set MLDIST_COMMUNICATION=ring")
    if decision.fallback:
        return Check("MPI engine", "warn", f"RING will be used: {decision.reason}", "see docs/concepts/engines.md")
    detail = f" ({decision.library})" if decision.library else ""
    why = f": {decision.reason}" if decision.reason else ""
    return Check("MPI engine", "ok", f"init() will use the {decision.name} engine{detail}{why}")


def _as_list(outcome: Check | list[tuple[str, str, str, str]]) -> list[Check]:
    return [outcome] if isinstance(outcome, Check) else [Check(*t) for t in outcome]


def _checks() -> tuple[Callable[[Mapping[str, str]], Check | list[tuple[str, str, str, str]]], ...]:
    from .checks import check_cpu_and_tensorflow, check_datasets, check_files, check_keras_backend, check_proxies

    return (
        check_cpu_and_tensorflow,
        check_keras_backend,
        check_mpi,
        check_worker_network,
        check_proxies,
        check_datasets,
        check_files,
    )


def run_checks(env: Mapping[str, str]) -> list[Check]:
    """Every check's outcome, in the order they are shown."""
    return [c for check in _checks() for c in _as_list(check(env))]


def exit_code(results: list[Check]) -> int:
    """0 when all are ok, 1 with warnings, 2 with failures.

    Example:
        >>> exit_code([Check("a", "ok", ""), Check("b", "warn", "")])
        1
    """
    return max((STATUSES.index(r.status) for r in results), default=0)


def format_checks(results: list[Check]) -> str:
    """One line per check, and its fix under it."""
    lines = []
    for r in results:
        lines.append(f"{r.status.upper():<5} {r.name}: {r.message}")
        if r.fix and r.status != "ok":
            lines.append(f"      fix: {r.fix}")
    return "\n".join(lines)
