"""The engine decision: one pure function, used by the launcher, the worker and the tools alike."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import pytest

from helpers import Probe
from mldist.errors import ConfigError
from mldist.placement import Placement, engines
from mldist.placement.engines import Decision, Facts, MpiWorld, decide, disagreement

WORLD2 = MpiWorld(0, 2, "Open MPI v5.0.11, package: Open MPI")
NO_MPI4PY = "mpi4py is not installed (pip install 'mldist[cpu]')"


@pytest.mark.parametrize(
    "requested, gpu, mpi, name, reason",
    [
        # CPU with a matching MPI world: MPI.
        ("auto", False, WORLD2, "mpi", ""),
        ("mpi", False, WORLD2, "mpi", ""),
        # CPU, a world of 1 under a 2-rank launcher (PyPI Open MPI under srun --mpi=pmi2, aprun): RING, saying why.
        ("auto", False, MpiWorld(0, 1, "Open MPI v5"), "ring", "sees rank 0 of 1 but the 'slurm' launcher says"),
        # CPU, mpi4py missing: RING with that reason.
        ("auto", False, NO_MPI4PY, "ring", "mpi4py is not installed"),
        # CPU, no MPI launcher at all (TF_CONFIG): RING.
        ("auto", False, None, "ring", "started no MPI world"),
        ("ring", False, WORLD2, "ring", ""),
        # GPU: NCCL by default, RING or MPI (host-staged) when asked.
        ("auto", True, None, "nccl", ""),
        ("nccl", True, None, "nccl", ""),
        ("ring", True, None, "ring", ""),
        ("mpi", True, WORLD2, "mpi", "host-staged"),
    ],
)
def test_the_decision_table(requested: str, gpu: bool, mpi: Any, name: str, reason: str) -> None:
    got = decide(Facts(requested, rank=0, size=2, launcher="slurm", gpu=gpu, mpi=mpi))
    assert got.name == name
    assert reason in got.reason and bool(reason) == bool(got.reason)


@pytest.mark.parametrize(
    "requested, gpu, mpi, message",
    [
        ("nccl", False, WORLD2, "needs a GPU"),
        ("mpi", False, MpiWorld(0, 1, "Open MPI v5"), "communication='mpi' cannot work here"),
        ("mpi", True, None, "use communication='ring'"),  # MPI on a GPU worker still needs a world
        ("mpi", False, NO_MPI4PY, "mpi4py is not installed"),
        ("gloo", False, None, "is not one of auto, mpi, ring, nccl"),
    ],
)
def test_impossible_requests_are_one_config_error(requested: str, gpu: bool, mpi: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        decide(Facts(requested, rank=0, size=2, launcher="slurm", gpu=gpu, mpi=mpi))


def test_one_process_needs_no_engine_and_no_mpi() -> None:
    assert decide(Facts("auto", rank=0, size=1, launcher="none", gpu=False)) == Decision("none", ANY_REASON)
    assert not engines.needs_mpi_probe("mpi", 1, gpu=False)
    assert engines.needs_mpi_probe("auto", 2, gpu=False) and not engines.needs_mpi_probe("auto", 2, gpu=True)


class _AnyReason(str):
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str)

    __hash__ = str.__hash__


ANY_REASON = _AnyReason()


def test_a_worker_names_a_disagreement_with_the_launcher_in_one_line() -> None:
    assert disagreement(None, Decision("ring")) == ""
    assert disagreement("mpi", Decision("mpi")) == ""
    line = disagreement("mpi", Decision("ring", "mpi4py is not installed"))
    assert "\n" not in line and "launcher chose the mpi engine" in line and "using ring" in line


def test_requested_engine_reads_the_argument_then_the_variable() -> None:
    assert engines.requested_engine("RING", {"MLDIST_COMMUNICATION": "mpi"}) == "ring"
    assert engines.requested_engine(None, {"MLDIST_COMMUNICATION": " Mpi "}) == "mpi"
    assert engines.requested_engine(None, {}) == "auto"
    with pytest.raises(ConfigError, match="'tcp' is not one of"):
        engines.requested_engine(None, {"MLDIST_COMMUNICATION": "tcp"})


class Spy:
    """Stands in for ``engines.decide``: records the call and returns a decision nobody else would make."""

    def __init__(self, name: str) -> None:
        self.calls: list[dict[str, Any]] = []
        self.name = name

    def __call__(self, facts: Facts) -> Decision:
        self.calls.append(dataclasses.asdict(facts))
        return Decision(self.name, "spy")


def test_the_launcher_decides_through_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    from mldist.launch import local
    from mldist.launch.config import RunConfig
    from mldist.launch.groups import DirectGroup
    from mldist.launch.mpiexec import MpiexecGroup

    for name, kind in (("ring", DirectGroup), ("mpi", MpiexecGroup)):
        spy = Spy(name)
        monkeypatch.setattr(engines, "decide", spy)
        decision, group = local.launch_plan(RunConfig(nprocs=2, command=("python", "t.py")), os.environ)
        assert (decision.name, group) == (name, kind)
        assert spy.calls and spy.calls[0]["size"] == 2


def test_the_worker_and_the_tools_decide_through_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    from mldist.runtime.start import worker
    from mldist.tools import doctor, report

    spy = Spy("nccl")
    monkeypatch.setattr(engines, "decide", spy)
    monkeypatch.setattr(report, "decide", spy)  # imported by name
    placement = Placement(rank=1, size=2, local_rank=1, local_size=2, launcher="tf_config")
    decision = worker._decision(placement, "ring", False, "tensorflow")
    assert decision == Decision("nccl", "spy") and spy.calls[-1]["rank"] == 1
    assert report._engine({}, placement, has_gpu=False)["choice"] == "nccl"
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "MLDIST_COMMUNICATION": "ring", "HOME": "/none"}
    assert "nccl engine" in doctor.check_mpi(env).message
    assert len(spy.calls) == 3


def test_one_function_named_decide_chooses_the_engine() -> None:
    """The others gather its facts or decode the launcher's: ``def decide`` is found once in the package."""
    src = Path(engines.__file__).parents[1]
    found = [
        f"{p.relative_to(src)}" for p in sorted(src.rglob("*.py")) if re.search(r"^def decide\b", p.read_text(), re.M)
    ]
    assert found == ["placement/engines.py"]


@pytest.mark.parametrize(
    "requested, env, gpu, asks, name",
    [
        ("auto", {}, False, True, "mpi"),
        ("mpi", {}, True, True, "mpi"),
        ("ring", {}, False, False, "ring"),
        ("auto", {}, True, False, "nccl"),
        (None, {"MLDIST_COMMUNICATION": "ring"}, False, False, "ring"),
        ("auto", {"KERAS_BACKEND": "jax"}, False, False, "jax"),
        ("mpi", {"KERAS_BACKEND": "jax"}, False, False, "jax"),
    ],
)
def test_gather_gathers_the_facts_and_joins_mpi_only_when_it_matters(
    requested: str | None, env: dict[str, str], gpu: bool, asks: bool, name: str
) -> None:
    probe = Probe(MpiWorld(0, 2, "Open MPI v5.0.8, package: x"))
    env = {"HOME": "/nonexistent", **env}
    decision = decide(engines.gather(requested, env, rank=0, size=2, launcher="openmpi", gpu=gpu, mpi=probe))
    assert (decision.name, probe.calls) == (name, int(asks))
    assert decision.backend == env.get("KERAS_BACKEND", "tensorflow")
    assert decision.library == ("Open MPI v5.0.8, package: x" if name == "mpi" else "")


def test_gather_takes_the_loaded_backend_over_the_environment() -> None:
    facts = engines.gather(
        "auto", {"KERAS_BACKEND": "tensorflow"}, rank=0, size=2, launcher="mldist", gpu=False, mpi=lambda: None,
        loaded_backend="jax",
    )  # fmt: skip
    decision = decide(facts)
    assert (decision.name, decision.backend, decision.traits.averages_in_step) == ("jax", "jax", True)


def test_the_decision_answers_what_the_launcher_and_the_tools_ask() -> None:
    fallback = Decision("ring", "mpi4py is not installed")
    assert fallback.fallback and not Decision("ring").fallback and not Decision("mpi", "host-staged").fallback
    assert Decision("mpi").mpi_world and not Decision("ring").mpi_world and not Decision("none").mpi_world
    assert (
        engines.announcement(None, fallback) == "using TensorFlow's RING collectives, not MPI: mpi4py is not installed"
    )
    assert engines.announcement("mpi", fallback).startswith("the launcher chose the mpi engine")
    assert engines.announcement(None, Decision("mpi", "host-staged: GPU")) == "MPI engine, host-staged: GPU"
    assert engines.announcement(None, Decision("nccl")) == ""
