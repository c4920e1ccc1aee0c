"""The lines of the stall watch (:mod:`mldist.runtime.watch.stall`): the timeout it reads, and what a rank says when a
collective passes it, naming the late ranks or, when every rank reached it, the engine and what to try next.

Example:
    >>> stall_message(1, "nccl", "allreduce(sum)", 612.0, 600.0)[:46]
    'rank 1 waited 612 s in allreduce(sum) (engine '
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...base import envvalues

#: What to try next, per engine.
HINTS: Mapping[str, str] = {
    "nccl": "NCCL collectives stall on some clusters (network, driver or NCCL_* settings): "
    "set MLDIST_COMMUNICATION=ring (mldist run --communication ring) to use TensorFlow's RING "
    "collectives instead",
    "ring": "a peer stopped making progress (stuck in its input pipeline or I/O, or running other "
    "steps); check the other ranks' output, or try MLDIST_COMMUNICATION=mpi on CPUs",
    "mpi": "another rank did not reach this collective (stuck, or running other steps); check the "
    "other ranks' output, or try MLDIST_COMMUNICATION=ring",
}


def collective_timeout(env: Mapping[str, str]) -> float:
    """Seconds from ``MLDIST_COLLECTIVE_TIMEOUT`` (default :data:`DEFAULT_TIMEOUT`; 0: no watch).

    A bad value is a ConfigError (:data:`mldist.base.envvalues.COLLECTIVE_TIMEOUT`).

    Example:
        >>> collective_timeout({}), collective_timeout({"MLDIST_COLLECTIVE_TIMEOUT": "0"})
        (600.0, 0.0)
    """
    return envvalues.COLLECTIVE_TIMEOUT.read(env)


def stall_message(rank: int, engine: str, what: str, seconds: float, timeout: float) -> str:
    """The one line a rank prints before the watch ends it.

    Args:
        rank: this rank.
        engine: "nccl", "ring" or "mpi".
        what: the collective ("allreduce(sum)", "broadcast", ...).
        seconds: how long it has been in flight.
        timeout: the limit it passed.

    Example:
        >>> "MLDIST_COMMUNICATION=ring" in stall_message(0, "nccl", "allreduce(sum)", 601, 600)
        True
    """
    hint = HINTS.get(engine, "check the other ranks' output")
    return (
        f"rank {rank} waited {seconds:.0f} s in {what} (engine {engine}) for the other workers, more than "
        f"{envvalues.COLLECTIVE_TIMEOUT.name}={timeout:g}; {hint}; {RAISE_IT}"
    )


#: The end of every stall message.
RAISE_IT = "raise MLDIST_COLLECTIVE_TIMEOUT if one step really takes this long (0 turns the watch off)"


def late_message(rank: int, engine: str, late: Sequence[str], seconds: float, timeout: float) -> str:
    """The stall message that names the late ranks (``late``: :func:`mldist.base.progress.late_lines`).

    Example:
        >>> late_message(0, "mpi", ["rank 1 has not reached collective #3 broadcast after 9 s: ..."], 9, 8)[:36]
        'rank 1 has not reached collective #3'
    """
    setting = f"{envvalues.COLLECTIVE_TIMEOUT.name}={timeout:g}"
    tail = f"rank {rank} waited {seconds:.0f} s (engine {engine}), more than {setting}"
    return "\n".join([*late, f"{tail}; {RAISE_IT}"])
