"""The process variables other tools read, for each worker mldist's launchers start.

``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``: many training scripts and
libraries read them for logging and sharding. Keras's three ``KERAS_DISTRIBUTION_*`` variables:
``keras.distribution.initialize()`` (JAX backend) forms its group from them, with rank 0's
address as JAX's coordinator; rank 0 also gets ``JAX_COORDINATOR_BIND_ADDRESS``, so that the
coordinator listens on that address only (JAX's default is every interface). JAX's conventional
three, ``JAX_COORDINATOR_ADDRESS`` (where known), ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``: many
scripts read them, and mldist's detector makes ``jax.distributed.initialize()`` with no arguments
form the group from them (:mod:`mldist.runtime.engines.jax_init`).

``TF_CONFIG`` when asked (``MLDIST_TF_CONFIG=1``: ``mldist run --tf-config``, ``mldist submit
--tf-config``): scripts written for ``tf.distribute.MultiWorkerMirroredStrategy`` read it.

Open MPI's choice of nonblocking all-reduce (``OMPI_MCA_coll_libnbc_iallreduce_algorithm``, see
:data:`MPI_TUNING`): read when MPI starts, so it is set here, before the worker imports mpi4py.

Never over a value the user set: the launcher says once which ones it kept. ``MASTER_ADDR`` and
``MASTER_PORT`` are not set: nothing of mldist's listens there.

Example:
    >>> variables(1, 4, 1, 2)
    {'RANK': '1', 'WORLD_SIZE': '4', 'LOCAL_RANK': '1', 'LOCAL_WORLD_SIZE': '2'}
    >>> added({"RANK": "7"}, variables(1, 4, 1, 2))
    {'WORLD_SIZE': '4', 'LOCAL_RANK': '1', 'LOCAL_WORLD_SIZE': '2'}
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from ..base import envvalues

NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
#: Keras's: job addresses (the first one coordinates), process count, this process's id.
KERAS = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID")
JAX_BIND = "JAX_COORDINATOR_BIND_ADDRESS"
#: JAX's conventional ones: rank 0's ``host:port``, the process count, this process's id (JAX itself reads
#: only the first; :mod:`mldist.runtime.engines.jax_init` reads them for ``jax.distributed.initialize()``).
JAX = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
#: Open MPI settings of every worker of two or more. libnbc, which runs MPI_Iallreduce, picks a binomial
#: reduce to rank 0 then a broadcast from it for fewer than 4 ranks or an in-place call (the engine's
#: buckets are both): the whole buffer crosses each link twice, one way after the other. Rabenseifner's
#: (3: a reduce-scatter, then an allgather, halves each way at once) moves it once. Measured on 2 hosts
#: over a 1 Gbit/s link: the example CNN went 1,910 -> 3,837 images/s per worker, the bare blocking
#: prototype's 3,799. Counts below the largest power of two of the ranks fall back to a ring; the
#: engine pads those to that length (``mldist.runtime.engines.mpi_join.allreduce``). Ignored by other MPIs.
#: MPI_Ireduce (the hierarchical all-reduce's reduce on a node, :mod:`mldist.runtime.engines.mpi_tiers`) as a binomial
#: tree (2): libnbc's default for 2 ranks on one host took 33 ms for 1.4 MB and 211 ms for 14 MB, the
#: binomial 0.4 ms and 12 ms.
MPI_TUNING = {"OMPI_MCA_coll_libnbc_iallreduce_algorithm": "3", "OMPI_MCA_coll_libnbc_ireduce_algorithm": "2"}
#: Rank 0's ``host:port`` where the launcher knows no other rank's (``mldist run -H``).
COORDINATOR = envvalues.COORDINATOR.name


def variables(rank: int, size: int, local_rank: int, local_size: int) -> dict[str, str]:
    """The four variables of one worker."""
    return dict(zip(NAMES, (str(rank), str(size), str(local_rank), str(local_size)), strict=True))


def keras_variables(rank: int, workers: Sequence[str]) -> dict[str, str]:
    """Keras's three variables of one worker (and JAX's bind address on rank 0); none for one process.

    Args:
        rank: the worker's rank.
        workers: ``host:port`` of every rank, in rank order (rank 0's coordinates).

    Example:
        >>> keras_variables(0, ["n1:2000", "n2:2001"])["KERAS_DISTRIBUTION_JOB_ADDRESSES"]
        'n1:2000,n2:2001'
        >>> sorted(keras_variables(1, ["n1:2000", "n2:2001"]).items())[-1]
        ('KERAS_DISTRIBUTION_PROCESS_ID', '1')
    """
    if len(workers) < 2:
        return {}
    values = dict(zip(KERAS, (",".join(workers), str(len(workers)), str(rank)), strict=True))
    return values | ({JAX_BIND: workers[0]} if rank == 0 else {})


def jax_variables(rank: int, size: int, coordinator: str) -> dict[str, str]:
    """JAX's three conventional variables of one worker; none for one process, no address where unknown.

    Args:
        rank: the worker's rank.
        size: how many workers.
        coordinator: rank 0's ``host:port``, or "" where only asking the other ranks would tell.

    Example:
        >>> jax_variables(1, 2, "n1:2000")
        {'JAX_COORDINATOR_ADDRESS': 'n1:2000', 'JAX_NUM_PROCESSES': '2', 'JAX_PROCESS_ID': '1'}
        >>> jax_variables(1, 2, "")
        {'JAX_NUM_PROCESSES': '2', 'JAX_PROCESS_ID': '1'}
    """
    if size < 2:
        return {}
    values = dict(zip(JAX, (coordinator, str(size), str(rank)), strict=True))
    return {name: value for name, value in values.items() if value}


def tf_config(rank: int, workers: Sequence[str]) -> dict[str, str]:
    """``TF_CONFIG`` of one worker: every rank a worker, this one at index ``rank``.

    Example:
        >>> tf_config(1, ["n1:2000", "n2:2001"])["TF_CONFIG"]
        '{"cluster": {"worker": ["n1:2000", "n2:2001"]}, "task": {"type": "worker", "index": 1}}'
    """
    return {"TF_CONFIG": json.dumps({"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": rank}})}


def for_tools(
    env: Mapping[str, str],
    rank: int,
    size: int,
    local_rank: int,
    local_size: int,
    workers: Sequence[str],
    coordinator: str = "",
) -> dict[str, str]:
    """Everything of this module one worker gets that ``env`` does not set already.

    Args:
        env: the worker's environment so far (the user's values win; ``MLDIST_TF_CONFIG=1`` asks for TF_CONFIG).
        rank, size, local_rank, local_size: the worker's place.
        workers: ``host:port`` of every rank, or () where unknown (then no TF_CONFIG).
        coordinator: rank 0's ``host:port`` where ``workers`` is unknown: enough for Keras's variables.

    Example:
        >>> got = for_tools({"MLDIST_TF_CONFIG": "1", "RANK": "5"}, 0, 2, 0, 2, ["h:1", "h:2"])
        >>> sorted(got)[-2:], sum(name.startswith("OMPI_MCA_coll_libnbc") for name in got)
        (['TF_CONFIG', 'WORLD_SIZE'], 2)
        >>> for_tools({}, 1, 2, 0, 1, (), "n1:2000")["KERAS_DISTRIBUTION_JOB_ADDRESSES"]
        'n1:2000'
        >>> for_tools({"JAX_PROCESS_ID": "5"}, 1, 2, 0, 1, (), "n1:2000")["JAX_COORDINATOR_ADDRESS"]
        'n1:2000'

    """
    values = variables(rank, size, local_rank, local_size) | (MPI_TUNING if size > 1 else {})
    if len(workers) == size:
        values |= keras_variables(rank, workers)
        if envvalues.TF_CONFIG.read(env):
            values |= tf_config(rank, workers)
        coordinator = workers[0]
    elif size > 1 and coordinator:
        values |= dict(zip(KERAS, (coordinator, str(size), str(rank)), strict=True))
        values |= {JAX_BIND: coordinator} if rank == 0 else {}
    values |= jax_variables(rank, size, coordinator)
    return added(env, values)


def added(env: Mapping[str, str], values: Mapping[str, str]) -> dict[str, str]:
    """``values`` that ``env`` does not set already (a user's own value wins)."""
    return {name: value for name, value in values.items() if name not in env}


def kept_note(env: Mapping[str, str]) -> str:
    """The launcher's one line when the environment sets any of them for every worker ("" if none).

    Example:
        >>> kept_note({"RANK": "3"})[:41]
        'RANK=3 of this environment stays as it is'
    """
    kept = [f"{name}={env[name]}" for name in (*NAMES, *KERAS, *JAX) if name in env]
    if not kept:
        return ""
    return (
        f"{' and '.join(kept)} of this environment stays as it is for every worker (mldist does not "
        "overwrite it); unset it to get each worker's own, or read MLDIST_RANK and MLDIST_SIZE"
    )


def strategy_note(env: Mapping[str, str], runs_tensorflow: bool) -> str:
    """The launcher's one line when workers get TF_CONFIG for Keras 3 on TensorFlow ("" otherwise).

    Keras 3's ``fit`` inside ``MultiWorkerMirroredStrategy`` fails with 2+ workers (keras#20585);
    TF-Keras (``TF_USE_LEGACY_KERAS=1``) works.

    Example:
        >>> strategy_note({"MLDIST_TF_CONFIG": "1", "TF_USE_LEGACY_KERAS": "1"}, True)
        ''
        >>> strategy_note({"MLDIST_TF_CONFIG": "1"}, True)[:60]
        'TF_CONFIG is set for tf.distribute.MultiWorkerMirroredStrate'
    """
    if not envvalues.TF_CONFIG.read(env) or not runs_tensorflow or env.get("TF_USE_LEGACY_KERAS") == "1":
        return ""
    return (
        "TF_CONFIG is set for tf.distribute.MultiWorkerMirroredStrategy, but Keras 3's fit fails inside it "
        "with 2+ workers (keras#20585): compile with mldist.keras.DistributedOptimizer and no strategy, "
        "or use KERAS_BACKEND=jax (TF-Keras scripts: set TF_USE_LEGACY_KERAS=1)"
    )
