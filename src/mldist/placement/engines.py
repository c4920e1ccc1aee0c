"""Which collective engine a run uses: decided once, by one pure function.

The launcher (``mldist run``), every worker (``mldist.init``), ``mldist env`` and
``mldist doctor`` all decide through :func:`decide`, the one function that chooses the engine,
from :class:`Facts` gathered once (:func:`gather`): the user's setting, the Keras backend,
whether the worker sees a GPU, its placement, the launcher's decision when one was handed
(:mod:`mldist.placement.handed` decodes it) and, only when it matters, the MPI world it
joined (or why none). The result, a :class:`Decision` (engine, backend, why, MPI library), is
what the launcher's ``RunConfig``, the run directory's ``config.json`` and the worker's
context carry. A worker takes the launcher's decision when its facts are the launcher's too,
and decides for itself only when no launcher of ours started it (a bare srun, mpirun or aprun)
or its facts differ, saying so in one line (:func:`announcement`).

Example:
    >>> decide(Facts("auto", rank=0, size=2, launcher="openmpi", gpu=False, mpi=MpiWorld(0, 2, "Open MPI v5")))
    Decision(name='mpi', reason='', backend='tensorflow', library='Open MPI v5', by='')
    >>> decide(Facts("auto", rank=0, size=2, launcher="tf_config", gpu=False)).name
    'ring'
    >>> decide(Facts("auto", rank=0, size=1, launcher="none", gpu=False)).name
    'none'
    >>> decide(Facts("auto", rank=0, size=2, launcher="slurm", gpu=False, backend="jax")).name
    'jax'
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from ..base import envvalues
from ..errors import ConfigError
from . import backend as keras_backends

COMMUNICATIONS = ("auto", "mpi", "ring", "nccl")
#: The variable in which the launcher hands the engine's name to the workers (for scripts: a worker
#: reads the whole decision, :data:`mldist.placement.handed.HANDED`).
DECIDED = envvalues.ENGINE.name

#: How to make mpi4py's world match the launcher's, per launcher (else :data:`DEFAULT_MPI_FIX`).
MPI_FIXES = {
    "slurm": "build mpi4py against the site's MPI, or use srun --mpi=pmix",
    "aprun": "build mpi4py against Cray MPICH (module load cray-mpich; "
    "MPICC='cc -shared' pip install --no-binary=mpi4py --no-cache-dir mpi4py)",
}
DEFAULT_MPI_FIX = "build mpi4py against the launcher's MPI"


@dataclass(frozen=True)
class MpiWorld:
    """What mpi4py reports about the MPI world this process joined (or the launcher will form).

    Args:
        rank, size: ``COMM_WORLD``'s.
        library: ``MPI.Get_library_version()``'s first line.
    """

    rank: int
    size: int
    library: str


@dataclass(frozen=True)
class Decision:
    """The engine of a run and the Keras backend it serves: what the launcher and ``init`` carry.

    Args:
        name: the engine: "none" (one process), "mpi", "ring", "nccl" or "jax".
        reason: why, when it is not the obvious one ("" otherwise).
        backend: the Keras backend ("tensorflow" or "jax"; see :mod:`mldist.placement.backend`).
        library: the MPI library's version line when the engine is "mpi" ("" otherwise).
        by: who decided when it was not this process: "mldist run", whose decision a worker took.
    """

    name: str
    reason: str = ""
    backend: str = keras_backends.DEFAULT
    library: str = ""
    by: str = ""

    @property
    def fallback(self) -> bool:
        """Whether TensorFlow's RING stands in for an MPI engine that could not be had (``reason`` says why).

        Example:
            >>> Decision("ring", "mpi4py is not installed").fallback, Decision("ring").fallback
            (True, False)
        """
        return self.name == "ring" and bool(self.reason)

    @property
    def traits(self) -> keras_backends.Traits:
        """What the backend means for the rest of mldist (:class:`mldist.placement.backend.Traits`).

        Example:
            >>> Decision("jax", backend="jax").traits.averages_in_step
            True
        """
        return keras_backends.traits(self.backend)

    @property
    def mpi_world(self) -> bool:
        """Whether the workers must form one MPI world: an MPI launcher (mpiexec, srun) starts them.

        Example:
            >>> Decision("mpi").mpi_world, Decision("jax").mpi_world
            (True, False)
        """
        return self.name == "mpi"


#: Who decided, in a decision a worker took from ``mldist run`` (:attr:`Decision.by`).
LAUNCHER = "mldist run"


@dataclass(frozen=True)
class Handed:
    """A launcher's decision as its workers get it (``MLDIST_DECISION``), with the facts it rests on.

    Args:
        decision: what the launcher decided.
        asked: the setting it decided for (:func:`requested_engine`).
        gpu: whether the launcher's host showed a GPU (:func:`gpu_device_nodes`).
        by: who decided: "mldist run", or "mldist submit" for a job script's ranks.
    """

    decision: Decision
    asked: str
    gpu: bool
    by: str = LAUNCHER


@dataclass(frozen=True)
class Facts:
    """What one engine decision rests on, gathered once (:func:`gather`); :func:`decide` reads nothing else.

    Args:
        requested: the user's setting, checked (:func:`requested_engine`).
        rank, size, launcher: the placement.
        gpu: whether the worker sees a GPU.
        mpi: the MPI world (joined, or to be formed by the launcher), a reason there is none, or None
            when none was asked for (no MPI launcher, or the decision does not depend on it).
        backend: the Keras backend.
        handed: the launcher's decision, or None where no launcher of ours decided.
    """

    requested: str
    rank: int
    size: int
    launcher: str
    gpu: bool
    mpi: MpiWorld | str | None = None
    backend: str = keras_backends.DEFAULT
    handed: Handed | None = None


def requested_engine(value: str | None, env: Mapping[str, str]) -> str:
    """The user's setting: ``value``, else ``MLDIST_COMMUNICATION``, else "auto"; checked.

    Example:
        >>> requested_engine(None, {"MLDIST_COMMUNICATION": "RING"})
        'ring'
    """
    comm = (value or envvalues.COMMUNICATION.read(env) or "auto").strip().lower()
    if comm not in COMMUNICATIONS:
        raise ConfigError(f"communication={comm!r} is not one of {', '.join(COMMUNICATIONS)}")
    return comm


def mpi_problem(rank: int, size: int, launcher: str, mpi: MpiWorld | str | None) -> str:
    """Why the MPI engine cannot serve this placement ("" when it can), with the fix.

    Example:
        >>> mpi_problem(1, 2, "aprun", MpiWorld(0, 1, "Open MPI v5.0.8, package: ..."))[:44]
        "mpi4py's MPI (Open MPI v5.0.8) sees rank 0 o"
    """
    if isinstance(mpi, str):
        return mpi
    if mpi is None:
        return f"the {launcher!r} launcher started no MPI world (start the workers with mpiexec, srun or mldist run)"
    if (mpi.size, mpi.rank) != (size, rank):
        name = mpi.library.split(",")[0]
        return (
            f"mpi4py's MPI ({name}) sees rank {mpi.rank} of {mpi.size} but the {launcher!r} launcher says "
            f"rank {rank} of {size}: {MPI_FIXES.get(launcher, DEFAULT_MPI_FIX)}"
        )
    return ""


def needs_mpi_probe(requested: str, size: int, gpu: bool, backend: str = keras_backends.DEFAULT) -> bool:
    """Whether :func:`decide` needs the MPI world (joining it initialises MPI: ask only then).

    Example:
        >>> needs_mpi_probe("auto", 2, gpu=True), needs_mpi_probe("mpi", 2, gpu=True)
        (False, True)
        >>> needs_mpi_probe("mpi", 2, gpu=False, backend="jax")  # JAX brings its own engine
        False
    """
    if backend == "jax":
        return False
    return size > 1 and (requested == "mpi" or (requested == "auto" and not gpu))


def _fits(handed: Handed, facts: Facts) -> bool:
    """Whether the facts ``handed`` rests on are this process's too: setting, GPU, backend, one process or many.

    A fact only the worker sees can differ: its GPU (``CUDA_VISIBLE_DEVICES``, another host's), the
    setting (``mldist.init(communication=...)``) or the backend (Keras imported first).
    """
    d = handed.decision
    return (handed.asked, handed.gpu, d.backend, d.name == "none") == (
        facts.requested,
        facts.gpu,
        facts.backend,
        facts.size == 1,
    )


def _taken(facts: Facts) -> Decision | None:
    """The launcher's decision as this process's, when it fits :func:`_fits` (the MPI engine's: in the
    world the launcher formed, with its library); else None."""
    handed = facts.handed
    if handed is None or not _fits(handed, facts):
        return None
    mine = replace(handed.decision, by=handed.by)
    if not mine.mpi_world:
        return mine
    world = facts.mpi
    if isinstance(world, MpiWorld) and not mpi_problem(facts.rank, facts.size, facts.launcher, world):
        return replace(mine, library=world.library)
    return None


def decide(facts: Facts) -> Decision:
    """The engine for these facts: the one function that chooses it (launcher, workers, ``mldist env``, doctor).

    A launcher's decision (``facts.handed``) is taken when it fits the facts (and, for the MPI
    engine, the world joined is the one the launcher formed); else the engine is chosen here.
    On the JAX backend the engine is always "jax" (JAX's distributed runtime: Gloo on CPUs,
    NCCL on GPUs): the gradients are averaged inside Keras's compiled step, where no other
    engine can reach.

    ``auto``: NCCL on GPU workers; MPI on CPU workers whose MPI world matches the
    launcher; else RING with the reason. ``mpi`` on GPU workers is host-staged (the
    fallback where NCCL stalls); it needs a matching world like on CPUs.

    Args:
        facts: what the decision rests on, gathered once (:func:`gather`).

    Example:
        >>> decide(Facts("mpi", rank=0, size=2, launcher="mldist", gpu=True, mpi=MpiWorld(0, 2, "x"))).reason[:11]
        'host-staged'
    """
    if (mine := _taken(facts)) is not None:
        return mine
    name, reason = _engine(facts)
    library = facts.mpi.library if name == "mpi" and isinstance(facts.mpi, MpiWorld) else ""
    return Decision(name, reason, facts.backend, library)


def _engine(facts: Facts) -> tuple[str, str]:
    """:func:`decide`'s engine and reason when it decides here."""
    requested, size, gpu, backend = facts.requested, facts.size, facts.gpu, facts.backend
    if requested not in COMMUNICATIONS:
        raise ConfigError(f"communication={requested!r} is not one of {', '.join(COMMUNICATIONS)}")
    if size == 1:
        return "none", "one process: no collectives"
    if backend == "jax":
        return "jax", f"communication={requested!r} does not apply to KERAS_BACKEND=jax" if requested != "auto" else ""
    if requested == "nccl" and not gpu:
        raise ConfigError("communication='nccl' needs a GPU on every worker; use 'mpi' or 'ring' on CPUs")
    problem = mpi_problem(facts.rank, size, facts.launcher, facts.mpi) if needs_mpi_probe(requested, size, gpu) else ""
    if requested == "mpi" and problem:
        raise ConfigError(f"communication='mpi' cannot work here: {problem}; or use communication='ring'")
    if requested == "mpi" and gpu:
        return "mpi", "host-staged: GPU tensors are copied to host memory for MPI (asked for 'mpi')"
    if requested != "auto":
        return requested, ""
    if gpu:
        return "nccl", ""
    return ("ring", problem) if problem else ("mpi", "")


def gather(
    requested: str | None,
    env: Mapping[str, str],
    *,
    rank: int,
    size: int,
    launcher: str,
    gpu: bool,
    mpi: Callable[[], MpiWorld | str | None],
    loaded_backend: str | None = None,
    handed: Handed | None = None,
) -> Facts:
    """Gather the facts :func:`decide` needs, once: the setting, the backend, and the MPI world only when it matters.

    Args:
        requested: the user's setting, or None for ``MLDIST_COMMUNICATION`` (see :func:`requested_engine`).
        env: the environment (``MLDIST_COMMUNICATION``, ``KERAS_BACKEND``, ``KERAS_HOME``).
        rank, size, launcher: the placement (the launcher's: rank 0 of the workers it starts).
        gpu: whether the worker sees a GPU.
        mpi: how to learn the MPI world (a worker joins it; the launcher looks for mpiexec);
            called only when the decision depends on it (:func:`needs_mpi_probe`, or a handed MPI engine).
        loaded_backend: ``keras.config.backend()`` when Keras is already imported (it wins over ``env``).
        handed: the launcher's decision (:func:`mldist.placement.handed.handed_in`), or None.

    Example:
        >>> facts = gather(None, {"KERAS_BACKEND": "jax"}, rank=0, size=2, launcher="mldist", gpu=False, mpi=str)
        >>> decide(facts)
        Decision(name='jax', reason='', backend='jax', library='', by='')
    """
    comm = requested_engine(requested, env)
    config = None if loaded_backend else keras_backends.read_config(env)  # the loaded backend wins: no file read
    keras = keras_backends.keras_backend(env, config, loaded=loaded_backend)
    facts = Facts(comm, rank=rank, size=size, launcher=launcher, gpu=gpu, backend=keras, handed=handed)
    fits = handed is not None and _fits(handed, facts)
    wanted = handed.decision.mpi_world if handed is not None and fits else needs_mpi_probe(comm, size, gpu, keras)
    return replace(facts, mpi=mpi()) if wanted else facts


def announcement(decided: str | None, mine: Decision) -> str:
    """What rank 0 says of its decision in one line: why the engine is not the obvious one, or
    differs from the launcher's (``decided``: the engine it handed, :mod:`mldist.placement.handed`); "" when there
    is nothing to say.

    Example:
        >>> announcement(None, Decision("ring", "mpi4py is not installed"))
        "using TensorFlow's RING collectives, not MPI: mpi4py is not installed"
        >>> announcement("mpi", Decision("mpi", "")), announcement(None, Decision("nccl", ""))
        ('', '')
    """
    if differs := disagreement(decided, mine):
        return differs
    if mine.fallback:
        return f"using TensorFlow's RING collectives, not MPI: {mine.reason}"
    if mine.name in ("mpi", "jax") and mine.reason:
        return f"{mine.name.upper()} engine, {mine.reason}"
    return ""


def disagreement(decided: str | None, mine: Decision) -> str:
    """The line a worker prints when the launcher's decision is not its own ("" when they agree).

    Example:
        >>> disagreement("mpi", Decision("ring", "no MPI world"))[:32]
        'the launcher chose the mpi engin'
    """
    if not decided or decided == mine.name:
        return ""
    why = f" ({mine.reason})" if mine.reason else ""
    return f"the launcher chose the {decided} engine but this worker can only use {mine.name}{why}; using {mine.name}"


def gpu_device_nodes(exists: Callable[[str], bool] = os.path.exists) -> bool:
    """Whether this host shows a GPU, without importing TensorFlow (4 s): the drivers' device nodes.

    For the launcher and the tools; a worker asks TensorFlow, which also honours CUDA_VISIBLE_DEVICES.

    Example:
        >>> gpu_device_nodes(lambda path: path == "/dev/kfd")
        True
    """
    return exists("/dev/nvidia0") or exists("/dev/kfd")
