"""Pure parts of mldist.keras (no workers started)."""

from __future__ import annotations

import pytest

from mldist.errors import ConfigError
from mldist.keras import LearningRateWarmup, scale_lr


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
