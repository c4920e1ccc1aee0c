"""mldist.keras without workers: pure parts, and the warm-up in a real one-process Keras fit."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import mldist.runtime
from helpers import check, clean_env, results, run_py
from mldist.errors import ConfigError
from mldist.keras import LearningRateWarmup, scale_lr
from mldist.keras.callbacks import WarmupSchedule


def test_scale_lr_rules() -> None:
    assert scale_lr(0.1, "linear", size=4) == pytest.approx(0.4)
    assert scale_lr(0.1, "sqrt", size=4) == pytest.approx(0.2)
    with pytest.raises(ConfigError, match="rule='cubic'"):
        scale_lr(0.1, "cubic", size=4)


def test_warmup_ramps_from_lr_over_size_to_lr() -> None:
    cb = LearningRateWarmup(warmup_steps=4, target_lr=0.8)
    cb._size = 2  # set by on_train_begin from mldist.size()
    assert [cb.lr_at(s) for s in range(6)] == pytest.approx([0.4, 0.5, 0.6, 0.7, 0.8, 0.8])


@pytest.mark.parametrize("kwargs", [{}, {"warmup_epochs": 1, "warmup_steps": 5}, {"warmup_steps": -1}])
def test_warmup_needs_one_non_negative_length(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        LearningRateWarmup(**kwargs)  # type: ignore[arg-type]


def _fit_recording_rates(monkeypatch: pytest.MonkeyPatch, opt: Any, warmup: LearningRateWarmup) -> list[float]:
    """Fit w to 1 (mse, one weight, 6 steps of plain SGD) as 2 workers; the rate each step really applied."""
    import keras

    monkeypatch.setattr(mldist.runtime, "init", lambda: SimpleNamespace(size=2, rank=0, is_chief=True))
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model.compile(opt, "mse")
    applied: list[float] = []
    before: list[float] = []
    weight = lambda: float(model.get_weights()[0][0, 0])  # noqa: E731
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: before.append(weight()),
        on_train_batch_end=lambda b, logs: applied.append((weight() - before[-1]) / (2 * (1 - before[-1]))),
    )
    x = np.ones((48, 1), "float32")
    model.fit(x, x, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[warmup, record])
    return applied


def test_warmup_scales_a_learning_rate_schedule_and_gives_it_back(monkeypatch: pytest.MonkeyPatch) -> None:
    import keras

    decay = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=2, decay_rate=0.5)
    opt = keras.optimizers.SGD(decay)
    applied = _fit_recording_rates(monkeypatch, opt, LearningRateWarmup(warmup_steps=4))
    # schedule(s) x (1/2 + 1/2 x min(s/4, 1)): the warm-up from half the rate, composed with the decay
    expected = [0.1 * 0.5 ** (s / 2) * (0.5 + 0.5 * min(s / 4, 1)) for s in range(6)]
    assert applied == pytest.approx(expected, rel=1e-4)
    assert opt._learning_rate is decay  # after fit: the user's schedule again (a saved model keeps it)
    wrapped = WarmupSchedule(decay, 4, 2)
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(wrapped))
    assert isinstance(again, WarmupSchedule) and float(again(1)) == pytest.approx(float(wrapped(1)))


def test_warmup_of_a_constant_rate_in_a_real_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    import keras

    applied = _fit_recording_rates(monkeypatch, keras.optimizers.SGD(0.2), LearningRateWarmup(warmup_steps=4))
    assert applied == pytest.approx([0.1, 0.125, 0.15, 0.175, 0.2, 0.2], rel=1e-4)


def test_a_target_rate_with_a_schedule_is_refused_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    import keras

    opt = keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5))
    with pytest.raises(ConfigError, match=r"target_lr=0.3\) with a learning-rate schedule.*leave target_lr out"):
        _fit_recording_rates(monkeypatch, opt, LearningRateWarmup(warmup_steps=4, target_lr=0.3))


ODD_REDUCTION = str(Path(__file__).resolve().parents[1] / "workers" / "odd_reduction.py")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_odd_bucket_sizes_and_a_compression_on_jax_are_refused_where_they_are_given(backend: str) -> None:
    """``bucket_bytes`` of the wrong type or size is refused at construction, not at the first step of a
    2-worker fit; on JAX, where Keras averages in its compiled step, a compression is refused, not ignored."""
    rows = results(check(run_py(ODD_REDUCTION, env=clean_env(KERAS_BACKEND=backend))).stdout)
    users = {"optimizer", "allreduce"} | ({"tape"} if backend == "tensorflow" else set())
    assert {r["user"] for r in rows} == users
    for row in rows:
        what = f"{row['user']} {row['case']}"
        if row["case"] == "bucket_bytes=1024" or (row["case"].startswith("compression") and backend == "tensorflow"):
            assert row["error"] is None, what
        elif row["case"].startswith("compression"):
            assert row["error"] == "UnsupportedError", what
            assert row["says"].startswith(f"{row['case']} cannot apply on KERAS_BACKEND=jax"), row["says"]
            assert "drop compression=" in row["says"]
        else:
            assert row["error"] == "ConfigError", what
            assert row["says"].startswith(f"{row['case']} is not a size in bytes: give a whole number"), row["says"]
