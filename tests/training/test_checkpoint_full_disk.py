"""Checkpoints on a disk that fills: the failed save is one line, the last good checkpoint stands, a rerun resumes.

2 real workers of tests/workers/resume.py under ``mldist run`` (16 steps per epoch, a checkpoint each
epoch) with the checkpoint directory on a real 8 MB tmpfs filled so that two checkpoints fit (each takes
16 kB of it: 12 kB of state, 4 kB of manifest). What the job does then (docs/guides/checkpoints.md):
training goes on and each later save tries again; a training that ends with its last state on no disk
exits with code 74 in one line; a rerun resumes from the newest checkpoint that was written.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import PY, WORKERS, clean_env, fill, mldist, small_disk, tail
from mldist.checkpoint.format import checkpoints, read_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    yield from small_disk(tmp_path / "disk", "8m")


def _run(out: Path) -> object:
    argv = ["run", "-n", "2", "--communication", "mpi", "--no-run-dir", "--", PY, str(WORKERS / "resume.py"),
            str(out), "--epochs", "4"]  # fmt: skip
    return mldist(argv, env=clean_env(), timeout=300)


def test_a_full_checkpoint_disk_names_each_failed_save_keeps_the_last_good_one_and_a_rerun_resumes(
    tmp_path: Path, disk: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (disk / "ckpt").mkdir()
    (out / "ckpt").symlink_to(disk / "ckpt")  # only the checkpoints on the small disk
    fill(disk, leave=40 << 10)
    res = _run(out)
    text = res.stdout + res.stderr  # type: ignore[attr-defined]
    assert res.returncode == 74, tail(res)  # type: ignore[attr-defined, arg-type]
    ckpt, said = disk / "ckpt", out / "ckpt"  # said: as the script names it
    for step in (48, 64):  # epochs 3 and 4: each failed save in one line
        line = (
            rf"\[0\] mldist: checkpoint {said}/ckpt-00000000{step} not saved \(No space left on device\): it "
            rf"needs 10\.\d kB, [0-9.]+ kB free there; the newest on disk is {said}/ckpt-0000000032; training goes "
            r"on and the next save tries again"
        )
        assert len(re.findall(line, text)) == 1, text[-4000:]
    end = re.findall(r"\[0\] mldist: error \(rank 0\): training ended but its last state is not on disk: .*", text)
    assert len(end) == 1 and f"the final model {said}/model.keras not saved (No space left on device)" in end[0]
    assert "Traceback" not in text and "MPI_ABORT" not in text and "prterun" not in text, text[-4000:]
    assert [s for s, _ in checkpoints(ckpt)] == [16, 32]
    assert read_checkpoint(ckpt / "ckpt-0000000032")[0]["step"] == 32  # the last good one, untouched
    assert sorted(p.name for p in ckpt.iterdir()) == ["ckpt-0000000016", "ckpt-0000000032"]  # no .tmp-*
    (disk / "filler").unlink()
    again = _run(out)
    assert again.returncode == 0, tail(again)  # type: ignore[arg-type]
    assert "resuming from checkpoint step 32: epoch 2, batch 0" in again.stderr  # type: ignore[attr-defined]
    assert [s for s, _ in checkpoints(ckpt)][-1] == 64 and (ckpt / "model.keras").is_file()
