"""Proxies kept away from the workers' own traffic: the ``no_proxy`` a worker adds for its peers.

Pure: environment in, variables out; ``init`` and the engines apply them, ``mldist env`` and
``mldist doctor`` print them.

Example:
    >>> worker_no_proxy({"http_proxy": "http://p:3128"}, ["n1:4000", "n2:4000"])["no_proxy"]
    'localhost,127.0.0.1,n1,n2'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

_PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy")


def proxy_settings(env: Mapping[str, str], hosts: Sequence[str]) -> dict[str, str]:
    """``no_proxy`` additions that keep gRPC between workers off the proxy.

    Compute nodes at several centres export an HTTP proxy; gRPC honours it
    and then cannot reach the other workers. Adding the worker hosts to
    ``no_proxy`` keeps the proxy for everything else (e.g. downloads).

    Args:
        env: current environment.
        hosts: host names of all workers.

    Example:
        >>> proxy_settings({"https_proxy": "http://p:3128"}, ["n1"])["no_proxy"]
        'localhost,127.0.0.1,n1'
        >>> proxy_settings({}, ["n1"])
        {}
    """
    if not any(env.get(v) for v in _PROXY_VARS):
        return {}
    current = env.get("no_proxy") or env.get("NO_PROXY") or ""
    items = [x for x in current.split(",") if x]
    for h in ("localhost", "127.0.0.1", *hosts):
        if h not in items:
            items.append(h)
    value = ",".join(items)
    return {"no_proxy": value, "NO_PROXY": value}


def worker_no_proxy(env: Mapping[str, str], workers: Sequence[str]) -> dict[str, str]:
    """:func:`proxy_settings` for the hosts of ``host:port`` worker addresses.

    Args:
        env: current environment.
        workers: every rank's ``host:port``.

    Example:
        >>> worker_no_proxy({}, ["n1:4000"])
        {}
    """
    return proxy_settings(env, sorted({w.rpartition(":")[0] for w in workers}))
