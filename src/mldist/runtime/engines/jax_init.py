"""JAX's own ``jax.distributed.initialize()``, with no arguments, in the workers of mldist's launchers.

JAX finds its processes only where it has a detector (Slurm, Open MPI before 5, Kubernetes, Cloud TPU,
mpi4py when asked); it reads ``JAX_COORDINATOR_ADDRESS`` but no process count or id. The start-up
hook gives every worker JAX's conventional ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and
``JAX_PROCESS_ID`` (:func:`mldist.placement.common.jax_variables`), and once the script imports JAX,
:mod:`mldist.runtime.start.patches` registers :class:`Finder` as JAX's first detector and fills in JAX's
timeouts (:func:`mldist.runtime.engines.jax_engine.jax_timeouts`) where the caller gave none. A worker whose
launcher gives no host list (mpiexec alone, aprun) learns rank 0's host as ``mldist.init()`` does, by
asking the other ranks over MPI, when ``initialize()`` runs.

The variants ``JAX_PROCESS_COUNT`` and ``JAX_PROCESS_INDEX`` are read too (some launchers set them).

Example::

    import jax
    jax.distributed.initialize()   # in a worker of `mldist run -n 2`: process 0 or 1 of 2
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ...base.envparse import whole
from ...errors import ConfigError
from ..watch.leave import leave
from . import jax_engine

#: The detector's name (``jax.distributed.initialize(cluster_detection_method="mldist")`` asks it alone).
NAME = "mldist"
ADDRESS = "JAX_COORDINATOR_ADDRESS"
#: The process count and this process's id, first name found wins.
COUNT = ("JAX_NUM_PROCESSES", "JAX_PROCESS_COUNT")
INDEX = ("JAX_PROCESS_ID", "JAX_PROCESS_INDEX")
#: JAX's switch of its preemption service (which catches SIGTERM and does nothing with it).
PREEMPTION = "JAX_ENABLE_PREEMPTION_SERVICE"


def _read(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, int] | None:
    """(name, value) of the first of ``names`` set in ``env``; None when none is; a ConfigError when not a number."""
    for name in names:
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        number = whole(0)(raw.strip())  # ASCII digits only: '²'.isdigit() is true, int('²') fails
        if number is None:
            raise ConfigError(f"{name}={raw!r} is not a whole number: unset it, or set it to this worker's value")
        return name, number
    return None


def world(env: Mapping[str, str]) -> tuple[int, int] | None:
    """(this process's id, the process count) from JAX's conventional variables; None when either is unset.

    Example:
        >>> world({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}), world({"JAX_PROCESS_INDEX": "0"})
        ((1, 2), None)
        >>> world({"JAX_NUM_PROCESSES": "\u00b2", "JAX_PROCESS_ID": "0"})
        Traceback (most recent call last):
        ...
        mldist.errors.ConfigError: JAX_NUM_PROCESSES='²' is not a whole number: unset it, ...
        >>> world({"JAX_PROCESS_COUNT": "2", "JAX_PROCESS_ID": "2"})
        Traceback (most recent call last):
        ...
        mldist.errors.ConfigError: JAX_PROCESS_ID=2 is outside a world of JAX_PROCESS_COUNT=2 processes: ...
    """
    count, index = _read(env, COUNT), _read(env, INDEX)
    if count is None or index is None:
        return None
    if count[1] < 1 or index[1] >= count[1]:
        raise ConfigError(
            f"{index[0]}={index[1]} is outside a world of {count[0]}={count[1]} processes: "
            "unset both to get this worker's own, or set them alike on every worker"
        )
    return index[1], count[1]


def coordinator(env: Mapping[str, str]) -> str:
    """Rank 0's ``host:port`` where ``JAX_COORDINATOR_ADDRESS`` is unset: mldist's placement, and where the
    launcher names no hosts, every rank's host over MPI (as ``mldist.init()`` finds them)."""
    from ...placement import build_cluster_spec, detect
    from .engine import mpi_allgather_hosts

    return build_cluster_spec(detect(env), env, mpi_allgather_hosts).workers[0]


def local_device(env: Mapping[str, str]) -> int | None:
    """The one GPU this process uses where ranks share a node's GPUs (as ``mldist.init()`` picks), else None."""
    from ...placement import detect

    ids, _ = jax_engine._gpu_ids(detect(env), env)
    return ids[0] if ids else None


class Finder:
    """JAX's detector of mldist's workers (:func:`mldist.runtime.compat.add_jax_cluster` registers it).

    Present where the process count and id are set; each answer is read from ``env`` when JAX asks.
    """

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def present(self) -> bool:
        return world(self.env) is not None

    def address(self, timeout: int | None) -> str:
        return self.env.get(ADDRESS) or coordinator(self.env)

    def count(self) -> int:
        return self._world()[1]

    def index(self) -> int:
        return self._world()[0]

    def local(self) -> int | None:
        return local_device(self.env)

    def _world(self) -> tuple[int, int]:
        found = world(self.env)
        if found is None:
            raise ConfigError(f"set {COUNT[0]} and {INDEX[0]} (this worker's process count and id)")
        return found


def given(initialize: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> set[str]:
    """The parameter names a call of ``initialize`` gives (positionally or by name).

    Example:
        >>> sorted(given(lambda a=None, b=None, c=None: None, (1,), {"c": 3}))
        ['a', 'c']
    """
    try:
        return set(inspect.signature(initialize).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):  # JAX says what is wrong with the call itself
        return set(kwargs)


def with_cluster_defaults(initialize: Callable[..., Any], env: Mapping[str, str]) -> Callable[..., Any]:
    """``jax.distributed.initialize`` with mldist's defaults where the caller gives none: JAX's timeouts
    (:func:`mldist.runtime.engines.jax_engine.jax_timeouts`), and JAX's preemption service off (it catches SIGTERM
    and does nothing: the launcher's stop must end the rank) unless ``JAX_ENABLE_PREEMPTION_SERVICE`` is set.

    Example:
        >>> def init(coordinator_address=None, heartbeat_timeout_seconds=100, shutdown_timeout_seconds=300):
        ...     return heartbeat_timeout_seconds, shutdown_timeout_seconds
        >>> env = {"MLDIST_COLLECTIVE_TIMEOUT": "30", "JAX_ENABLE_PREEMPTION_SERVICE": "1"}
        >>> with_cluster_defaults(init, env)(shutdown_timeout_seconds=7)
        (30, 7)
    """
    try:
        accepted = set(inspect.signature(initialize).parameters)
    except (TypeError, ValueError):
        accepted = set()

    @functools.wraps(initialize)
    def initialize_for_a_cluster(*args: Any, **kwargs: Any) -> Any:
        mine = {k: v for k, v in jax_engine.jax_timeouts(env).items() if k in accepted}
        named = given(initialize, args, kwargs)
        for name in named:
            mine.pop(name, None)
        if not {"num_processes", "process_id"} <= named:  # JAX asks the detector: a bad value is one line
            try:
                world(env)
            except ConfigError as exc:
                leave(str(exc), 2)
        if PREEMPTION not in env:
            import jax

            jax.config.update("jax_enable_preemption_service", False)  # type: ignore[no-untyped-call]
        return initialize(*args, **kwargs, **mine)

    return initialize_for_a_cluster
