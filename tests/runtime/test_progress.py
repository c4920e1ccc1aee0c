"""Where every rank is: the records the watch publishes, and the lines that name a late rank (pure parts)."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from mldist.base import nodes, progress
from mldist.base.progress import Record
from mldist.runtime.watch import stall, stall_lines
from mldist.runtime.watch.frames import frames_of, main_thread_frames

STACK = ("stuck.py:9 <module>: time.sleep(600)",)


def _record(rank: int, began: int, *, current: tuple[int, str, float] | None = None, written: float = 100.0) -> Record:
    return Record(rank, "n1", 1000 + rank, began, began - (current is not None), current,
                  (began - 1, "allreduce(sum)", 50.0) if began > 1 else None, STACK, written)  # fmt: skip


def test_a_rank_that_has_not_begun_the_collective_is_named_with_where_it_is() -> None:
    lines = stall_lines.late_lines(0, 58, "allreduce(sum)", 20, {0: _record(0, 58), 1: _record(1, 57)}, 2, None, 101)
    assert len(lines) == 1
    assert lines[0].startswith("rank 1 has not reached collective #58 allreduce(sum) after 20 s: it finished #56")
    assert lines[0].endswith("is in stuck.py:9 <module>: time.sleep(600)")


def test_a_stale_record_says_how_old_it_is_and_why() -> None:
    (line,) = stall_lines.late_lines(0, 5, "broadcast", 30, {1: _record(1, 3, written=70.0)}, 2, None, 100)
    assert "this is 30 s old" in line and "holds Python's lock" in line


def test_a_rank_in_an_earlier_collective_says_which_and_for_how_long() -> None:
    rec = _record(1, 4, current=(4, "allgather", 90.0))
    (line,) = stall_lines.late_lines(0, 5, "broadcast", 12, {1: rec}, 2, None, 100)
    assert "is in collective #4 allgather for 10 s" in line


def test_out_of_step_ranks_name_both_collectives() -> None:
    rec = _record(1, 58, current=(58, "broadcast(root=0)", 90.0))
    lines = stall_lines.late_lines(0, 58, "allreduce(sum)", 20, {1: rec}, 2, None, 100)
    assert lines == ["rank 0 is in #58 allreduce(sum) while rank 1 is in #58 broadcast(root=0)"]


def test_many_late_ranks_are_listed_then_counted_and_missing_ones_named() -> None:
    records = {r: _record(r, 2) for r in range(1, 8)}
    lines = stall_lines.late_lines(0, 3, "allreduce(sum)", 20, records, 10, Path("/p"), 100)
    assert [line.split(" has")[0] for line in lines[:4]] == ["rank 1", "rank 2", "rank 3", "rank 4"]
    assert lines[4] == "and 5 more late rank(s): 5, 6, 7, 8, 9"
    assert not stall_lines.late_lines(0, 3, "x", 20, {0: _record(0, 3)}, 2, Path("/p"), 100)  # nothing known: no names


def test_records_round_trip_and_damaged_ones_are_skipped(tmp_path: Path) -> None:
    where = tmp_path / "progress"
    progress.write(where, _record(1, 3, current=(3, "allreduce(sum)", 99.0)))
    (where / "rank-2.json").write_text("{not json")
    (where / "rank-3.json").write_text('{"rank": 3}')
    assert list(progress.read(where)) == [1]
    assert progress.read(where)[1] == _record(1, 3, current=(3, "allreduce(sum)", 99.0))
    assert where.stat().st_mode & 0o777 == 0o700
    assert progress.describe(progress.read(where)[1], now=100.0)[0] == (
        "rank 1 (n1, pid 1001): in collective #3 allreduce(sum) for 1 s"
    )


def test_the_folder_is_decided_by_the_launcher_then_the_run_directory_then_the_job() -> None:
    assert progress.folder({"MLDIST_PROGRESS_DIR": "/a", "MLDIST_RUN_DIR": "/b"}) == Path("/a")
    assert progress.folder({"MLDIST_RUN_DIR": "/b", "SLURM_JOB_ID": "7"}) == Path("/b/progress")
    slurm = progress.folder({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"})
    assert slurm is not None and slurm.name == "progress-7.0"
    pmix = progress.folder({"PMIX_NAMESPACE": "prterun-host-123@1", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"})
    assert pmix is not None and pmix.name == "progress-prterun-host-123_1"  # one mpiexec of a batch job
    assert progress.folder({}) is None


def test_the_main_threads_frames_read_from_another_thread_show_the_users_line() -> None:
    here = frames_of(sys._getframe())
    assert here[0].startswith("tests/runtime/test_progress.py:") and "here = frames_of" in here[0]
    seen: list[tuple[str, ...]] = []
    ready, done = threading.Event(), threading.Event()

    def look() -> None:
        ready.wait()
        time.sleep(0.1)
        seen.append(main_thread_frames())
        done.set()

    threading.Thread(target=look).start()
    ready.set()
    done.wait(10)  # the main thread waits here: this line, then the library's frame it is inside
    assert "done.wait(10)" in seen[0][0] and seen[0][-1].startswith("inside threading.py:"), seen


def test_the_watch_publishes_numbered_collectives_and_names_the_late_rank(tmp_path: Path) -> None:
    now, wall = [0.0], [1000.0]
    watches = [
        stall.Watch(r, "mpi", 10, clock=lambda: now[0], size=2, where=tmp_path, wall=lambda: wall[0]) for r in (0, 1)
    ]
    for w in watches:  # both ranks run two collectives
        for what in ("broadcast", "allreduce(sum)"):
            w.end(w.begin(what))
    token = watches[0].begin("allreduce(sum)")  # rank 0 begins #3; rank 1 never does
    for w in watches:  # a second apart: the node's file in the shared folder is rewritten once a second
        wall[0] += nodes.NODE_SECONDS
        w.publish()
    assert progress.read(tmp_path)[1].last == (2, "allreduce(sum)", 1000.0)
    now[0], wall[0] = 12.0, 1012.0
    line = watches[0].overdue() or ""
    assert line.startswith("rank 1 has not reached collective #3 allreduce(sum) after 12 s: it finished #2")
    assert line.splitlines()[-1].startswith("rank 0 waited 12 s (engine mpi), more than MLDIST_COLLECTIVE_TIMEOUT=10")
    watches[0].end(token)
    assert watches[0].overdue() is None


def test_a_record_that_cannot_be_made_never_ends_the_watch_and_is_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    def broken() -> tuple[str, ...]:
        raise TypeError("'<=' not supported between instances of 'int' and 'NoneType'")

    monkeypatch.setattr(stall, "main_thread_frames", broken)
    watch = stall.Watch(0, "mpi", 10, size=2, where=tmp_path)
    for _ in range(stall.FAILURES_SAID + 3):
        watch.publish()  # raises nothing
    assert capfd.readouterr().err.count("cannot record this rank's progress (TypeError") == 1
    monkeypatch.setattr(stall, "main_thread_frames", lambda: ("x.py:1 f: g()",))
    watch.publish()
    assert progress.read(tmp_path)[0].stack == ("x.py:1 f: g()",)


def test_records_go_to_node_local_memory_and_one_small_file_per_node_to_the_shared_folder(tmp_path: Path) -> None:
    """At any size a rank writes every second, into node-local memory; the shared folder sees node-HOST.rec
    files only, each rewritten in place (no create, no rename in steady state), records of a few hundred bytes."""
    assert progress.interval(64) == progress.interval(16384) == 1.0
    shared, wall = tmp_path / "shared", [1000.0]
    watches = [
        stall.Watch(r, "mpi", 600, size=16384, where=shared, wall=lambda: wall[0], host=f"n{r // 2}",
                    local=tmp_path / f"shm{r // 2}")
        for r in range(4)
    ]  # fmt: skip
    for w in watches:
        w.end(w.begin("allreduce(sum)"))
        wall[0] += nodes.NODE_SECONDS
        w.publish()
    assert sorted(p.name for p in shared.iterdir()) == ["node-n0.rec", "node-n1.rec"]
    records = progress.read(shared)
    assert list(records) == [0, 1, 2, 3] and records[3].host == "n1" and records[0].every == 1.0
    assert all(len(nodes.encode(asdict(r))) < 1000 for r in records.values())
    inode = (shared / "node-n0.rec").stat().st_ino
    wall[0] += nodes.NODE_SECONDS
    watches[1].begin("broadcast")
    watches[1].publish()
    assert (shared / "node-n0.rec").stat().st_ino == inode  # rewritten in place
    assert progress.read(shared)[1].current == (2, "broadcast", wall[0])
    assert not records[0].stale(records[0].written + 4) and records[0].stale(records[0].written + 5)


def test_one_rank_reads_the_records_when_a_collective_times_out_and_the_others_take_its_verdict(
    tmp_path: Path,
) -> None:
    """8 ranks on 4 nodes, rank 5 never reaches collective #2: one rank reads the records (once), every other
    waiting rank names rank 5 from its verdict, and no one reads again for the same wait."""
    shared, now, wall = tmp_path / "shared", [0.0], [1000.0]
    watches = [
        stall.Watch(r, "mpi", 10, clock=lambda: now[0], size=8, where=shared, wall=lambda: wall[0],
                    host=f"n{r // 2}", local=tmp_path / f"shm{r // 2}")
        for r in range(8)
    ]  # fmt: skip
    for w in watches:
        w.end(w.begin("allreduce(sum)"))
        if w.rank != 5:
            w.begin("allreduce(sum)")
    for w in watches:  # as every second: each node's file has its ranks' records
        wall[0] += nodes.NODE_SECONDS
        w.publish()
    now[0], wall[0] = 12.0, 1012.0
    said = {w.rank: w.overdue() for w in watches if w.rank != 5}
    now[0], wall[0] = 13.0, 1013.0
    said |= {r: watches[r].overdue() for r, line in said.items() if line is None}  # their node's reader had it
    assert all(
        line and line.startswith("rank 5 has not reached collective #2 allreduce(sum)") for line in said.values()
    )
    assert sum(w.verdicts.judged for w in watches if w.verdicts) == 1, said


def test_a_sampled_wait_every_rank_is_in_is_judged_once_not_every_second(tmp_path: Path) -> None:
    """On JAX a computation every rank is in may be long: no stall, and the records are read once for it, not
    again each second the watch looks."""
    from mldist.runtime.watch import jax_watch

    now = [0.0]
    watch = stall.Watch(0, "jax", 10, clock=lambda: now[0], size=2, where=tmp_path, wall=lambda: 1000 + now[0])
    watch.sampler = jax_watch.Waits(lambda frame: ("JAX computation step across processes", 1))
    busy = Record(1, "n2", 9, 1, 0, (1, "JAX computation step across processes", 1000.0), None, (), 1030.0)
    progress.write(tmp_path, busy)
    assert watch.overdue() is None  # the first sample: the wait counts from here
    for second in range(30, 40):
        now[0] = float(second)
        assert watch.overdue() is None
    assert watch.verdicts is not None and watch.verdicts.judged == 1
