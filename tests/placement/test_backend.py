"""Which Keras backend a worker runs, and the engine it gets: pure functions, no Keras import."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from mldist.errors import ConfigError
from mldist.launch.config import RunConfig
from mldist.launch.groups import DirectGroup
from mldist.launch.local import launch_plan
from mldist.launch.rundir import config_record
from mldist.placement import backend
from mldist.placement.engines import Facts, MpiWorld, decide
from mldist.placement.resources import ThreadPlan
from mldist.runtime.engines.jax_engine import visible_gpus, xla_flags


def test_the_variable_wins_over_keras_json_and_an_imported_keras_wins_over_both(tmp_path: Path) -> None:
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "jax", "floatx": "float32"}))
    env = {"KERAS_HOME": str(tmp_path)}
    assert backend.keras_backend(env, backend.read_config(env)) == "jax"
    assert backend.keras_backend({**env, "KERAS_BACKEND": "tensorflow"}, backend.read_config(env)) == "tensorflow"
    assert backend.keras_backend({"KERAS_BACKEND": "jax"}, None, loaded="tensorflow") == "tensorflow"
    assert backend.keras_backend({"HOME": str(tmp_path / "nobody")}, backend.read_config({})) in backend.BACKENDS


def test_a_broken_keras_json_is_ignored_as_keras_does(tmp_path: Path) -> None:
    (tmp_path / "keras.json").write_text("{not json")
    assert backend.keras_backend({"KERAS_HOME": str(tmp_path)}, backend.read_config({"KERAS_HOME": str(tmp_path)})) == (
        "tensorflow"
    )


def test_unknown_and_unsupported_backends_say_why_in_one_line() -> None:
    with pytest.raises(ConfigError, match="KERAS_BACKEND='tf' is not one of"):
        backend.keras_backend({"KERAS_BACKEND": "tf"})
    for name in ("torch", "numpy", "openvino"):
        with pytest.raises(ConfigError, match=f"KERAS_BACKEND={name} "):
            backend.check_supported(name)


def test_jax_always_gets_the_jax_engine_and_names_an_ignored_request() -> None:
    world = MpiWorld(0, 2, "Open MPI")
    auto = decide(Facts("auto", rank=0, size=2, launcher="openmpi", gpu=False, mpi=world, backend="jax"))
    asked = decide(Facts("ring", rank=0, size=2, launcher="slurm", gpu=False, backend="jax"))
    one = decide(Facts("auto", rank=0, size=1, launcher="none", gpu=False, backend="jax"))
    assert (auto.name, auto.reason) == ("jax", "")
    assert asked.name == "jax" and "communication='ring' does not apply" in asked.reason
    assert one.name == "none"


def test_the_launcher_starts_jax_workers_directly_and_records_the_backend() -> None:
    cfg = RunConfig(nprocs=2, command=("python", "t.py"))
    decision, group = launch_plan(cfg, {"KERAS_BACKEND": "jax", "PATH": ""})
    assert (decision.name, group) == ("jax", DirectGroup)
    decided = dataclasses.replace(cfg, decision=decision)
    assert config_record(decided, "direct", {"KERAS_BACKEND": "jax"})["keras_backend"] == "jax"


def test_jax_thread_and_gpu_settings() -> None:
    assert xla_flags("", ThreadPlan(1, 1, 1, "x")).endswith("intra_op_parallelism_threads=1")
    assert (
        xla_flags("--xla_cpu_multi_thread_eigen=true", ThreadPlan(1, 1, 1, "x")) == "--xla_cpu_multi_thread_eigen=true"
    )
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, ["a", "b"]) == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, ["a"]) == 0
    assert visible_gpus({}, ["a", "b"]) == 2
