"""``JobSpec`` values that need no rendering (``mldist.launch.batch.spec``).

What the renderer refuses or accepts is in test_render_refusals.py.
"""

from __future__ import annotations

import pytest

from mldist.launch.batch.spec import parse_time


@pytest.mark.parametrize("text, seconds", [("30", 1800), ("0:45", 45), ("2:00:00", 7200), ("1-12", 129600)])
def test_times(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds
