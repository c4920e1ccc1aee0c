"""Every engine states what it can do; the rest of mldist asks those flags, never the engine's name."""

from __future__ import annotations

import pytest

from mldist.errors import UnsupportedError
from mldist.runtime.engines import engine

#: The flags of the Engine protocol, per engine: (subgroups, joins, xla_safe, late_strategy, waits_at_exit).
EXPECTED = {
    "none": (True, False, False, False, False),
    "mpi": (True, True, False, True, True),
    "ring": (False, False, False, False, False),
    "nccl": (False, False, True, False, False),
    "jax": (False, False, True, False, True),
}
FLAGS = ("subgroups", "joins", "xla_safe", "late_strategy", "waits_at_exit")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_engine_states_every_flag(name: str) -> None:
    eng = engine.get(name)
    assert eng.name == name
    assert tuple(getattr(eng, flag) for flag in FLAGS) == EXPECTED[name]
    assert isinstance(eng.in_place, bool)


@pytest.mark.parametrize("name", ["ring", "nccl", "jax"])
def test_an_engine_without_subgroups_refuses_them_naming_itself(name: str) -> None:
    eng = engine.get(name)
    with pytest.raises(UnsupportedError, match=f"this run uses {name}"):
        eng.subgroup(1, (0,))
    with pytest.raises(UnsupportedError, match="join needs the MPI engine"):
        eng.join()


def test_one_process_is_its_own_world() -> None:
    solo = engine.SOLO
    assert solo.allreduce(["b"], "sum") == ["b"] and solo.broadcast(["b"], 0, 0) == ["b"]
    assert solo.allgather("v", 1) == "v"
    assert solo.subgroup(3, (0,)).comm is None and solo.start(None, None) == (None, ())  # type: ignore[arg-type]


def test_running_is_the_started_engine_and_needs_init(monkeypatch: pytest.MonkeyPatch) -> None:
    from mldist.errors import RuntimeStateError
    from mldist.runtime.context import STATE

    monkeypatch.setattr(STATE, "ctx", None)
    with pytest.raises(RuntimeStateError):
        engine.running()
    monkeypatch.setattr(STATE, "ctx", object())
    monkeypatch.setattr(STATE, "engine", None)
    assert engine.running() is engine.SOLO
    monkeypatch.setattr(STATE, "engine", engine.get("ring"))
    assert engine.running() is engine.get("ring")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_engines_with_host_collectives_take_numpy_without_tensorflow(name: str) -> None:
    """RING and NCCL are TensorFlow's own collectives (no host ones); the others reduce numpy arrays as such."""
    host = engine.get(name).host
    assert (host is None) == (name in ("ring", "nccl"))
    if name == "none":
        assert host.allreduce(["a"], "sum") == ["a"] and host.allgather("v", 1) == "v"
