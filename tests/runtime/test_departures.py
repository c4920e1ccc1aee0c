"""Joins and exits cost O(N) (issue 61): departures through a hub and one barrier, join notes without listings."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers import PY, WORKERS, clean_env, tail
from mldist.base import joined

MPIRUN = str(Path(PY).parent / "mpirun")


def test_ranks_depart_with_2_n_minus_1_messages_in_all_not_n_n_minus_1() -> None:
    """4 real MPI ranks depart together: 6 messages (each rank tells rank 0, rank 0 tells each), not 12."""
    env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="^ofi")
    res = subprocess.run(
        [MPIRUN, "-n", "4", "--oversubscribe", PY, str(WORKERS / "departures.py")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, tail(res)
    sent = {int(r): int(n) for _, r, n in (line.split() for line in res.stdout.splitlines() if line.startswith("SENT"))}
    assert sent == {0: 3, 1: 1, 2: 1, 3: 1}, tail(res)


def test_join_marks_and_notes_are_read_without_listing_the_folder_or_an_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A joining rank reads one file (the ranks that ended without joining), a rank finishing alone one file (the
    marks) and the notes of the marked ranks only; nothing is fsynced: 2N fsyncs and N listings of N entries were
    what 16,384 ranks cost one directory."""
    for rank in range(64):
        joined.mark(tmp_path, rank, "run1", f"train.py:{rank}")
    joined.mark(tmp_path, 99, "run0", "old.py:1")  # an earlier launch's
    joined.unmark(tmp_path, 5)
    for rank in (1, 2):
        joined.write(tmp_path, rank, joined.ALONE if rank == 1 else "mldist.init", "run1")
    joined.write(tmp_path, 7, joined.FAILED, "run1")

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("listed or fsynced")

    for name in ("scandir", "listdir", "fsync"):
        monkeypatch.setattr(os, name, refused)
    monkeypatch.setattr(Path, "iterdir", refused)
    assert joined.ended(tmp_path, "run1") == {1: joined.ALONE, 7: joined.FAILED}
    marks = joined.marks(tmp_path, "run1")
    assert sorted(marks) == [r for r in range(64) if r != 5] and marks[3] == "train.py:3"
    assert joined.noted(tmp_path, [1, 2, 3], "run1") == {1: joined.ALONE, 2: "mldist.init"}
    joined.write(tmp_path, 9, joined.ALONE, "run1")  # no fsync on the way
    monkeypatch.undo()
    assert joined.read(tmp_path) == {1: "alone", 2: "mldist.init", 7: "failed", 9: "alone"}  # the launcher's view
