"""The process variables many training scripts and libraries read: ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``, for each worker mldist's launchers start.

Never over a value the user set: the launcher says once which ones it kept. ``MASTER_ADDR`` and
``MASTER_PORT`` are not set: nothing of mldist's listens there.

Example:
    >>> variables(1, 4, 1, 2)
    {'RANK': '1', 'WORLD_SIZE': '4', 'LOCAL_RANK': '1', 'LOCAL_WORLD_SIZE': '2'}
    >>> added({"RANK": "7"}, variables(1, 4, 1, 2))
    {'WORLD_SIZE': '4', 'LOCAL_RANK': '1', 'LOCAL_WORLD_SIZE': '2'}
"""

from __future__ import annotations

from collections.abc import Mapping

NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def variables(rank: int, size: int, local_rank: int, local_size: int) -> dict[str, str]:
    """The four variables of one worker."""
    return dict(zip(NAMES, (str(rank), str(size), str(local_rank), str(local_size)), strict=True))


def added(env: Mapping[str, str], values: Mapping[str, str]) -> dict[str, str]:
    """``values`` that ``env`` does not set already (a user's own value wins)."""
    return {name: value for name, value in values.items() if name not in env}


def kept_note(env: Mapping[str, str]) -> str:
    """The launcher's one line when the environment sets any of them for every worker ("" if none).

    Example:
        >>> kept_note({"RANK": "3"})[:41]
        'RANK=3 of this environment stays as it is'
    """
    kept = [f"{name}={env[name]}" for name in NAMES if name in env]
    if not kept:
        return ""
    return (
        f"{' and '.join(kept)} of this environment stays as it is for every worker (mldist does not "
        "overwrite it); unset it to get each worker's own, or read MLDIST_RANK and MLDIST_SIZE"
    )
