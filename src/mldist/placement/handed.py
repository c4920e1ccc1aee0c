"""The launcher's engine decision as its workers get it: whole, with the facts it rests on.

``mldist run`` decides the engine once (:func:`mldist.placement.engines.decide`) and hands
the whole :class:`~mldist.placement.engines.Decision` to its workers in one variable
(:data:`HANDED`, one line of JSON: :func:`encode`, :func:`decode`), with what it was asked and
whether its host showed a GPU; a job script of ``mldist submit`` does the same once, on the
job's first node, before it starts the ranks (:func:`for_job`). A worker decodes it once
(:func:`handed_in`) and takes it (:func:`~mldist.placement.engines.decide`) when those facts are
its own too; it decides for itself only when no launcher of ours started it (a bare srun, mpirun
or aprun), or a fact only it sees differs (the GPU, ``mldist.init(communication=...)``, Keras
imported on another backend, an MPI world other than the one the launcher formed). ``mldist env``
says which (:func:`provenance`).

Example:
    >>> ring = Handed(Decision("ring", "mpi4py is not installed"), "auto", gpu=False)
    >>> facts = engines.Facts("auto", rank=1, size=2, launcher="mldist", gpu=False, handed=decode(encode(ring)))
    >>> engines.decide(facts)
    Decision(name='ring', reason='mpi4py is not installed', backend='tensorflow', library='', by='mldist run')
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ..base import envvalues
from ..errors import ConfigError
from . import backend as keras_backends
from . import engines
from .engines import COMMUNICATIONS, LAUNCHER, Decision, Handed, MpiWorld

#: The variable in which the launcher hands its whole decision to the workers (:func:`encode`).
HANDED = envvalues.DECISION.name
#: Who decided, in a decision the ranks of a job script of ``mldist submit`` took (:attr:`Decision.by`).
SUBMIT = "mldist submit"
#: Who may have decided a handed decision (:attr:`Handed.by`).
DECIDERS = (LAUNCHER, SUBMIT)
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
    by = {"by": handed.by} if handed.by != LAUNCHER else {}  # mldist run's decisions read as before
    return json.dumps({**fields, "asked": handed.asked, "gpu": handed.gpu, **by}, sort_keys=True, separators=(",", ":"))


def sent(decision: Decision, asked: str) -> str:
    """What the launcher hands its workers (:data:`HANDED`'s value): ``decision`` and the facts it rests
    on, as the launcher gathered them (``asked``; this host's GPU device nodes).

    Example:
        >>> decode(sent(Decision("ring"), "ring")).asked
        'ring'
    """
    return encode(Handed(decision, asked, engines.gpu_device_nodes()))


def for_job(env: Mapping[str, str], size: int, launcher: str, *, gpu: bool, mpi4py: bool) -> str:
    """What a job script of ``mldist submit`` hands its ranks (:data:`HANDED`'s value): the decision for
    ``size`` ranks that ``launcher`` starts, from the facts of the node the script runs on.

    The script computes it once, on the job's first node, after its modules, environment and container
    are in place: there the GPU, the mpi4py and the Keras backend are the ranks' (a login node's are
    not). The MPI world is the one ``launcher`` will form; each rank checks it once joined.

    Args:
        env: the job's environment (``MLDIST_COMMUNICATION``, ``KERAS_BACKEND``).
        size: the job's ranks.
        launcher: what starts them (srun, mpiexec, aprun, ...).
        gpu: whether this node shows a GPU (:func:`~mldist.placement.engines.gpu_device_nodes`).
        mpi4py: whether mpi4py is installed.

    Example:
        >>> got = decode(for_job({"HOME": "/nonexistent"}, 8, "srun", gpu=False, mpi4py=True))
        >>> got.decision.name, got.by
        ('mpi', 'mldist submit')
    """
    world = MpiWorld(0, size, launcher) if mpi4py else "mpi4py is not installed (pip install 'mldist[cpu]')"
    facts = engines.gather(None, env, rank=0, size=size, launcher=launcher, gpu=gpu, mpi=lambda: world)
    return encode(Handed(engines.decide(facts), facts.requested, gpu, by=SUBMIT))


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
        decoded: Handed | None = Handed(decision, got["asked"], got["gpu"], got.get("by", LAUNCHER))
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
    typed = isinstance(d.reason, str) and isinstance(d.library, str) and isinstance(given.gpu, bool)
    return known and typed and given.by in DECIDERS


def handed_in(env: Mapping[str, str]) -> Handed | None:
    """The launcher's decision in ``env`` (:data:`HANDED`), or None where no launcher of ours decided.

    Example:
        >>> text = encode(Handed(Decision("jax", backend="jax"), "auto", False))
        >>> handed_in({}) is None, handed_in({HANDED: text}).asked
        (True, 'auto')
    """
    text = envvalues.DECISION.read(env)
    return decode(text) if text else None


def provenance(decision: Decision, handed: bool, by: str = LAUNCHER) -> str:
    """Who decided ``decision`` and why, in one line (``mldist env``).

    Args:
        decision: the worker's decision.
        handed: whether a launcher of ours handed it one (taken or not).
        by: who decided the handed one (:attr:`Handed.by`).

    Example:
        >>> provenance(Decision("mpi", by="mldist run"), handed=True)
        "decided by mldist run: CPU workers in an MPI world that matches the launcher's"
        >>> provenance(Decision("ring", "mpi4py is not installed"), handed=False)
        'decided here: mpi4py is not installed (no mldist launcher)'
    """
    why = decision.reason or OBVIOUS.get(decision.name, "")
    if decision.by:
        return f"decided by {decision.by}: {why}"
    return f"decided here: {why} ({f'its facts differ from those of {by}' if handed else 'no mldist launcher'})"
