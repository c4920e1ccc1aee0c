"""A run directory on a disk that fills: the job's own output never ends the job.

Real ``mldist run -n 2`` launches of plain Python workers on a real small tmpfs (:func:`helpers.small_disk`):
the disk fills mid-run, or is full from the start. The run goes on, every line reaches the terminal,
the launcher says once what stopped, summary.json is written when it can be (else one line says so),
and no temporary file or folder is left behind (the launcher's ``TMPDIR`` is the test's own).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import PY, clean_env, fill, mldist, small_disk, tail
from mldist.launch.output import RunLogs, tidy

#: A worker that prints 300 lines of 1 kB per rank (600 kB in all, for a disk of 200 kB).
SPAM = "for i in range(300):\n    print(f'line {i} ' + 'x' * 1000, flush=True)\nprint('DONE', flush=True)\n"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    yield from small_disk(tmp_path / "disk", "200k")


def _run(tmp_path: Path, disk: Path, engine: str) -> tuple[object, Path, Path]:
    script, temp = tmp_path / "spam.py", tmp_path / "tmp"
    script.write_text(SPAM)
    temp.mkdir()
    env = clean_env(TMPDIR=str(temp))
    res = mldist(["run", "-n", "2", "--communication", engine, "--run-dir", str(disk / "r"), "--", PY, str(script)],
                 env=env, timeout=120)  # fmt: skip
    return res, disk / "r", temp


def _launcher_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not re.match(r"\[[0-9]+\] ", line)]


@pytest.mark.parametrize("engine", ["mpi", "ring"])
def test_a_run_directory_that_fills_mid_run_keeps_the_run_its_output_and_its_summary(
    tmp_path: Path, disk: Path, engine: str
) -> None:
    res, run_dir, temp = _run(tmp_path, disk, engine)
    assert res.returncode == 0, tail(res)  # type: ignore[attr-defined]
    out, err = res.stdout, res.stderr  # type: ignore[attr-defined]
    for rank in (0, 1):  # every line still reached the terminal
        assert sum(line.startswith(f"[{rank}] line ") for line in out.splitlines()) == 300, tail(res)  # type: ignore[arg-type]
        assert f"[{rank}] DONE" in out
    said = [line for line in _launcher_lines(err) if "is full" in line]
    assert said == [
        f"mldist run: the disk of the run directory {run_dir} is full: rank-0.log, rank-1.log stop here; the rest "
        "of the output reaches this terminal only, and the run goes on"
    ], err[-3000:]
    assert "Traceback" not in err and "Exception in thread" not in err and "BrokenPipe" not in err
    summary = json.loads((run_dir / "summary.json").read_text())  # the space kept for it at the start
    assert summary["exit_code"] == 0 and summary["dropped"] == ["rank-0.log", "rank-1.log"]
    assert (run_dir / "config.json").is_file()
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".")]  # no temporary file, no reserve
    assert not list(temp.iterdir())  # the launcher's folders (mldist-run-*, mldist-notes-*) are gone


def test_a_run_directory_full_from_the_start_runs_and_says_what_it_could_not_write(tmp_path: Path, disk: Path) -> None:
    (disk / "r").mkdir()
    fill(disk)
    res, run_dir, temp = _run(tmp_path, disk, "mpi")
    assert res.returncode == 0, tail(res)  # type: ignore[attr-defined]
    assert res.stdout.count("DONE") == 2  # type: ignore[attr-defined]
    lines = _launcher_lines(res.stderr)  # type: ignore[attr-defined]
    assert f"mldist run: config.json not written in {run_dir} (No space left on device); the run goes on; tried " \
        "again at the end" in lines, lines  # fmt: skip
    assert f"mldist run: config.json and summary.json not written in {run_dir} (No space left on device); the " \
        "run ended with code 0" in lines, lines  # fmt: skip
    assert "Traceback" not in res.stderr and not list(temp.iterdir())  # type: ignore[attr-defined]
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".")]


def test_logs_that_cannot_be_written_stop_together_and_are_named_once(tmp_path: Path, disk: Path) -> None:
    logs = RunLogs(str(disk), 3)
    fill(disk)
    for _ in range(3):
        logs.write(1, b"x" * 100_000 + b"\n")  # never raises
    assert logs.dropped == ["rank-0.log", "rank-1.log", "rank-2.log"] and logs.failure is not None
    logs.close()


def test_progress_bars_arrive_as_their_last_state_and_colour_only_on_a_terminal() -> None:
    bar = b"\x1b[1m1/4\x1b[0m \x1b[32m\xe2\x94\x81\x1b[0m\x08\x08\r\x1b[1m4/4\x1b[0m - loss: 0.5   \n"
    assert tidy(bar, colour=False) == b"4/4 - loss: 0.5\n"
    assert tidy(bar) == b"\x1b[1m4/4\x1b[0m - loss: 0.5\n"
    assert tidy(b"plain\r\n", colour=False) == b"plain\n" and tidy(b"no end", colour=False) == b"no end"


def test_a_keras_like_progress_bar_through_mldist_run_is_one_clean_line_per_epoch(tmp_path: Path) -> None:
    """Keras redraws its bar with ``\\r`` and bold/colour codes whatever its output is (it tests ``posix``)."""
    script = tmp_path / "bar.py"
    script.write_text(
        "import sys\n"
        "for epoch in (1, 2):\n"
        "    for step in range(1, 5):\n"
        "        sys.stdout.write('\\b' * 20 + '\\r' + f'\\x1b[1m{step}/4\\x1b[0m \\x1b[32m' + '=' * step + "
        "'\\x1b[0m - loss: 0.5' + ('\\n' if step == 4 else ''))\n"
        "        sys.stdout.flush()\n"
    )
    res = mldist(["run", "-n", "2", "--communication", "ring", "--run-dir", str(tmp_path / "r"), "--", PY,
                  str(script)])  # fmt: skip
    assert res.returncode == 0, tail(res)
    for rank in (0, 1):
        assert [line for line in res.stdout.splitlines() if line.startswith(f"[{rank}]")] == [
            f"[{rank}] 4/4 ==== - loss: 0.5"
        ] * 2, res.stdout
        assert (tmp_path / "r" / f"rank-{rank}.log").read_text() == "4/4 ==== - loss: 0.5\n" * 2
    assert "\x1b" not in res.stdout and "\r" not in res.stdout
