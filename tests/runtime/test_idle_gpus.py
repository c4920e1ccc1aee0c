"""One process per node with several GPUs, averaging outside a strategy scope: warned once, with the fix."""

from __future__ import annotations

import sys
import types
import warnings

import pytest

from mldist.placement.engines import Decision
from mldist.placement.resources import idle_gpus_warning
from mldist.runtime.start import worker


@pytest.mark.parametrize(
    "gpus, local_size, in_scope, warns",
    [(4, 1, False, True), (2, 1, False, True), (4, 4, False, False), (4, 1, True, False), (1, 1, False, False)],
)
def test_the_decision(gpus: int, local_size: int, in_scope: bool, warns: bool) -> None:
    assert (idle_gpus_warning(gpus, local_size, in_scope) is not None) == warns


def test_the_message_names_both_fixes() -> None:
    text = idle_gpus_warning(8, 1, False) or ""
    assert "sees 8 GPUs but trains on one" in text
    assert "--tasks-per-node=8" in text and "mldist.strategy().scope()" in text


def test_warned_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tf = types.SimpleNamespace(
        config=types.SimpleNamespace(list_logical_devices=lambda kind: ["gpu0", "gpu1"]),
        distribute=types.SimpleNamespace(has_strategy=lambda: False),
    )
    monkeypatch.setitem(sys.modules, "tensorflow", fake_tf)
    monkeypatch.setattr(worker, "init", lambda: types.SimpleNamespace(local_size=1, decision=Decision("none")))
    monkeypatch.setattr(worker, "_warned_idle_gpus", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        worker.warn_idle_gpus()
        worker.warn_idle_gpus()
    assert [str(w.message)[:35] for w in caught] == ["this process sees 2 GPUs but trains"]
