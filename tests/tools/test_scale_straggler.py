"""benchmarks/scale_straggler.py at small N: rank 0's real account at the default thresholds, fed the rows the
engine's gather brings, names a rank 10 % slower within 5 minutes at under a CPU-second a minute, and says nothing
of a balanced run, quiet or loaded."""

from __future__ import annotations

import importlib.util
import subprocess

from helpers import PY, ROOT, clean_env, tail

SCRIPT = ROOT / "benchmarks" / "scale_straggler.py"


def _module() -> object:
    spec = importlib.util.spec_from_file_location("scale_straggler", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_meet_the_goals_at_small_n() -> None:
    (row,) = _module().rows([64])  # type: ignore[attr-defined]
    assert row["ranks"] == 64 and row["nodes"] == 16
    assert 30 <= row["named_s"] <= 300 and 30 <= row["named_fast_s"] <= 300, row  # the window is 30 s
    assert row["balanced_line"] is False and row["loaded_line"] is False and row["cpu_s_per_min"] <= 1.0, row
    assert row["goals"] == {"cpu_s_per_min": 1.0, "named_s": 300.0, "balanced_line": False, "loaded_line": False}


def test_main_prints_the_table_and_refuses_bad_ranks_in_one_line() -> None:
    res = subprocess.run(
        [PY, str(SCRIPT), "--ranks", "16"], capture_output=True, text=True, env=clean_env(), timeout=300
    )
    assert res.returncode == 0, tail(res)
    assert "rank 0 CPU s/min" in res.stdout and res.stdout.splitlines()[-1].split()[0] == "goal", res.stdout
    bad = subprocess.run(
        [PY, str(SCRIPT), "--ranks", "1,x"], capture_output=True, text=True, env=clean_env(), timeout=60
    )
    assert bad.returncode == 2, tail(bad)
    (line,) = bad.stderr.splitlines()
    assert line.startswith("scale_straggler.py: error: --ranks '1,x': give rank counts of 2 or more"), line
