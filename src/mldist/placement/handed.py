"""The launcher's engine decision as its workers get it: whole, with the facts it rests on.

``mldist run`` decides the engine once (:func:`mldist.placement.engines.decide_with`) and hands
the whole :class:`~mldist.placement.engines.Decision` to its workers in one variable
(:data:`HANDED`, one line of JSON: :func:`encode`, :func:`decode`), with what it was asked and
whether its host showed a GPU. A worker takes it (:func:`decide`) when those facts are its own too;
it decides for itself only when no launcher of ours started it (a bare srun, mpirun or aprun), or
a fact only it sees differs (the GPU, ``mldist.init(communication=...)``, Keras imported on another
backend, an MPI world other than the one the launcher formed). ``mldist env`` says which
(:func:`provenance`).

Example:
    >>> ring = Handed(Decision("ring", "mpi4py is not installed"), "auto", gpu=False)
    >>> decide(decode(encode(ring)), None, {}, rank=1, size=2, launcher="mldist", gpu=False, mpi=lambda: None)
    Decision(name='ring', reason='mpi4py is not installed', backend='tensorflow', library='', by='mldist run')
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from ..base import envvalues
from ..errors import ConfigError
from . import backend as keras_backends
from . import engines
from .engines import COMMUNICATIONS, Decision, MpiWorld

#: The variable in which the launcher hands its whole decision to the workers (:func:`encode`).
HANDED = envvalues.DECISION.name
#: Who decided, in a decision a worker took from its launcher (:attr:`Decision.by`).
LAUNCHER = "mldist run"
#: The engines a decision names ("none": one process).
ENGINES = ("none", "mpi", "ring", "nccl", "jax")
#: Why an engine was chosen when its decision gives no reason (it is the obvious one): for ``mldist env``.
OBVIOUS = {
    "none": "one process: no collectives",
    "nccl": "the workers see a GPU",
    "mpi": "CPU workers in an MPI world that matches the launcher's",
    "ring": "asked for 'ring'",
    "jax": "KERAS_BACKEND=jax: JAX's runtime averages inside the step",
}


@dataclass(frozen=True)
class Handed:
    """The launcher's decision as its workers get it (:data:`HANDED`), with the facts it rests on.

    Args:
        decision: what the launcher decided.
        asked: the setting it decided for (:func:`~mldist.placement.engines.requested_engine`).
        gpu: whether the launcher's host showed a GPU (:func:`~mldist.placement.engines.gpu_device_nodes`).
    """

    decision: Decision
    asked: str
    gpu: bool


def encode(handed: Handed) -> str:
    """``handed`` as one line of JSON, the value of :data:`HANDED` (:func:`decode` reads it back).

    Example:
        >>> text = encode(Handed(Decision("ring", "mpi4py is not installed"), "auto", gpu=False))
        >>> text[:56]
        '{"asked":"auto","backend":"tensorflow","engine":"ring","'
        >>> decode(text) == Handed(Decision("ring", "mpi4py is not installed"), "auto", gpu=False)
        True
    """
    d = handed.decision
    fields = {"engine": d.name, "reason": d.reason, "backend": d.backend, "library": d.library}
    return json.dumps({**fields, "asked": handed.asked, "gpu": handed.gpu}, sort_keys=True, separators=(",", ":"))


def sent(decision: Decision, asked: str) -> str:
    """What the launcher hands its workers (:data:`HANDED`'s value): ``decision`` and the facts it rests
    on, as the launcher gathered them (``asked``; this host's GPU device nodes).

    Example:
        >>> decode(sent(Decision("ring"), "ring")).asked
        'ring'
    """
    return encode(Handed(decision, asked, engines.gpu_device_nodes()))


def decode(text: str) -> Handed:
    """The decision :func:`encode` wrote; ConfigError (one line naming the variable) for any other text.

    Example:
        >>> decode('{"engine": "tcp"}')
        Traceback (most recent call last):
        ...
        mldist.errors.ConfigError: MLDIST_DECISION='{"engine": "tcp"}' is not a decision of mldist run: ...
    """
    try:
        got = json.loads(text)
        decision = Decision(got["engine"], got["reason"], got["backend"], got["library"])
        decoded: Handed | None = Handed(decision, got["asked"], got["gpu"])
    except (ValueError, KeyError, TypeError):
        decoded = None
    if decoded is None or not _well_formed(decoded):
        raise ConfigError(
            f"{HANDED}={text!r} is not a decision of mldist run: unset it (each worker then decides for itself)"
        )
    return decoded


def _well_formed(given: Handed) -> bool:
    d = given.decision
    known = d.name in ENGINES and d.backend in keras_backends.SUPPORTED and given.asked in COMMUNICATIONS
    return known and isinstance(d.reason, str) and isinstance(d.library, str) and isinstance(given.gpu, bool)


def handed_in(env: Mapping[str, str]) -> Handed | None:
    """The launcher's decision in ``env`` (:data:`HANDED`), or None where no launcher of ours decided.

    Example:
        >>> text = encode(Handed(Decision("jax", backend="jax"), "auto", False))
        >>> handed_in({}) is None, handed_in({HANDED: text}).asked
        (True, 'auto')
    """
    text = env.get(HANDED, "")
    return decode(text) if text.strip() else None


def taken(handed: Handed, *, requested: str, size: int, gpu: bool, backend: str) -> Decision | None:
    """The launcher's decision as this worker's, when the facts it rests on are this worker's too; else None.

    A fact only the worker sees can differ: its GPU (``CUDA_VISIBLE_DEVICES``, another host's), the
    setting (``mldist.init(communication=...)``) or the backend (Keras imported first). The MPI
    engine's world is checked once joined (:func:`decide`).

    Example:
        >>> nccl = Handed(Decision("nccl"), "auto", gpu=True)
        >>> taken(nccl, requested="auto", size=2, gpu=True, backend="tensorflow").by
        'mldist run'
        >>> taken(nccl, requested="auto", size=2, gpu=False, backend="tensorflow") is None
        True
    """
    d = handed.decision
    if (handed.asked, handed.gpu, d.backend, d.name == "none") != (requested, gpu, backend, size == 1):
        return None
    return replace(d, by=LAUNCHER)


def decide(
    handed: Handed | None,
    requested: str | None,
    env: Mapping[str, str],
    *,
    rank: int,
    size: int,
    launcher: str,
    gpu: bool,
    mpi: Callable[[], MpiWorld | str | None],
    loaded_backend: str | None = None,
) -> Decision:
    """A worker's decision: the launcher's (``handed``) when it fits (:func:`taken`; the MPI engine's
    world once joined), else the worker's own (:func:`~mldist.placement.engines.decide_with`).

    Args:
        handed: the launcher's decision (:func:`handed_in`), or None.
        requested, env, rank, size, launcher, gpu, mpi, loaded_backend: as for ``decide_with``.

    Example:
        >>> mpi = Handed(Decision("mpi", library="mpiexec /usr/bin/mpiexec"), "auto", gpu=False)
        >>> world = MpiWorld(1, 2, "Open MPI v5")
        >>> decide(mpi, None, {}, rank=1, size=2, launcher="openmpi", gpu=False, mpi=lambda: world).library
        'Open MPI v5'
    """
    comm = engines.requested_engine(requested, env)
    keras = keras_backends.keras_backend(env, keras_backends.read_config(env), loaded=loaded_backend)
    mine = taken(handed, requested=comm, size=size, gpu=gpu, backend=keras) if handed is not None else None
    if mine is None:
        return engines.decide_with(
            comm, env, rank=rank, size=size, launcher=launcher, gpu=gpu, mpi=mpi, loaded_backend=keras
        )
    if not mine.mpi_world:
        return mine
    world = mpi()  # the MPI engine joins it anyway: it must be the world the launcher formed
    if isinstance(world, MpiWorld) and not engines.mpi_problem(rank, size, launcher, world):
        return replace(mine, library=world.library)
    return engines.decide(comm, rank=rank, size=size, launcher=launcher, gpu=gpu, mpi=world, backend=keras)


def provenance(decision: Decision, handed: bool) -> str:
    """Who decided ``decision`` and why, in one line (``mldist env``).

    Args:
        decision: the worker's decision.
        handed: whether a launcher of ours handed it one (taken or not).

    Example:
        >>> provenance(Decision("mpi", by="mldist run"), handed=True)
        "decided by mldist run: CPU workers in an MPI world that matches the launcher's"
        >>> provenance(Decision("ring", "mpi4py is not installed"), handed=False)
        'decided here: mpi4py is not installed (no mldist launcher)'
    """
    why = decision.reason or OBVIOUS.get(decision.name, "")
    if decision.by:
        return f"decided by {decision.by}: {why}"
    return f"decided here: {why} ({'its facts differ from those of mldist run' if handed else 'no mldist launcher'})"
