"""The control plane at 256 to 16,384 simulated ranks: what the shared folder sees, and what one stuck rank costs.

    python benchmarks/scale.py [--ranks 256,1024] [--rounds 3] [--json] [--no-straggler]

Drives the project's own code in one process: N collective watches (:class:`mldist.runtime.watch.stall.Watch`)
on N/4 simulated nodes (each its own host name and node-local folder: :mod:`mldist.base.nodes`), the
one-reader verdict (:mod:`mldist.runtime.watch.verdict`), ``mldist stacks`` (a real subprocess), the join
notes (:mod:`mldist.base.joined`) and the departures' peers (:func:`mldist.runtime.engines.mpi_exit.told`). A
counting layer over ``os`` and ``io`` counts every call on the shared folder: metadata operations (open,
create, rename, unlink, stat, mkdir, listing, fsync) and data writes and reads.

Per N:
- steady state: rank records carried to the shared folder a second, node files written a second, metadata
  operations a second there (goal: at most 2,000 at 16,384 ranks), files there (goal: one per node), bytes
  per rank record;
- one stuck rank (every other rank waits in an all-reduce past the timeout, each looking once a simulated
  second as its watch thread does): rank records read in all (goal: at most 4 N), simulated seconds after
  the timeout until every waiting rank has the verdict naming it (goal: within 30), the reader's peak memory
  for it (goal: 200 MB), metadata operations on the shared folder until then;
- ``mldist stacks`` on the folder: seconds and peak memory (goal: 2 s, 300 MB);
- joins: shared-folder metadata operations and directory listings for N ranks that join, then exit (goal:
  O(N), no listing); exits: departure messages in all (goal: O(N); was N (N - 1)).

If ``benchmarks/scale_straggler.py`` is there (its ``rows(ranks)``), its rows follow: the slow-rank account.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from mldist.base import joined, nodes, progress
from mldist.runtime.engines import mpi_exit
from mldist.runtime.watch import stall, stall_lines

RANKS_PER_NODE = 4
TIMEOUT = 30.0
#: Collectives each simulated rank runs a second.
PER_SECOND = 8
GOALS = {"metadata_per_s_16k": 2000, "files": "1 per node", "reads": "4 N", "named_s": 30, "reader_mb": 200,
         "stacks_s": 2.0, "stacks_mb": 300}  # fmt: skip
METADATA = ("open", "rename", "unlink", "stat", "mkdir", "listing", "fsync")


class Counting:
    """Counts calls of ``os`` and ``io`` on paths under ``root`` (and the descriptors opened there)."""

    def __init__(self, root: Path) -> None:
        self.root, self.counts, self._fds = str(root), Counter[str](), set[int]()
        self._saved: list[tuple[Any, str, Any]] = []

    def _under(self, path: Any) -> bool:
        return isinstance(path, str | os.PathLike) and os.fspath(path).startswith(self.root)

    def _wrap(self, owner: Any, name: str, kind: str | None, by_fd: bool = False) -> None:
        real = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            first = args[0] if args else kwargs.get("path", kwargs.get("file"))
            if (by_fd and first in self._fds) or (not by_fd and self._under(first)):
                self.counts[kind or name] += 1
            out = real(*args, **kwargs)
            if name == "open" and owner is os and self._under(first):
                self._fds.add(out)
            return out

        self._saved.append((owner, name, real))
        setattr(owner, name, counted)

    @contextlib.contextmanager
    def on(self) -> Iterator[Counting]:
        """Count while inside."""
        for owner, name, kind in [(os, "open", "open"), (io, "open", "open"), (builtins, "open", "open"),
                                  (os, "replace", "rename"), (os, "rename", "rename"), (os, "unlink", "unlink"),
                                  (os, "stat", "stat"), (os, "lstat", "stat"), (os, "mkdir", "mkdir"),
                                  (os, "scandir", "listing"), (os, "listdir", "listing")]:  # fmt: skip
            self._wrap(owner, name, kind)
        for name, kind in (("pwrite", "write"), ("write", "write"), ("read", "read"), ("pread", "read"),
                           ("fsync", "fsync")):  # fmt: skip
            self._wrap(os, name, kind, by_fd=True)
        try:
            yield self
        finally:
            for owner, name, real in reversed(self._saved):
                setattr(owner, name, real)
            self._saved.clear()

    def metadata(self) -> int:
        return sum(self.counts[k] for k in METADATA)


def _watches(size: int, shared: Path, local: Path, wall: Callable[[], float], clock: Callable[[], float]) -> list[Any]:
    """N watches on N/4 nodes; the ranks of a node share one :class:`Node` here (one process per rank in a job:
    the same calls on the shared folder once each rank has opened its descriptor)."""
    out, node_of = [], {}
    for rank in range(size):
        host = f"n{rank // RANKS_PER_NODE:05d}"
        watch = stall.Watch(rank, "mpi", TIMEOUT, clock=clock, size=size, where=shared, wall=wall, host=host,
                            local=local / host)  # fmt: skip
        if host not in node_of:
            node_of[host] = nodes.Node(shared, local / host, host, keep=True, defer=False)
            node_of[host].keep_peers = False  # descriptors: 2 a simulated node, under the limit
        watch.node = node_of[host]
        watch.node._slots.setdefault(rank, nodes.Slot(local / host / f"rank-{rank}.rec", keep=False))
        out.append(watch)
    return out


class Job:
    """N simulated ranks, their clocks, and the counting layer over the shared folder."""

    def __init__(self, size: int, base: Path) -> None:
        self.size, self.shared, self.local = size, base / "shared", base / "local"
        self.now, self.t0 = 0.0, time.time()
        self.count = Counting(self.shared)
        self.watches = _watches(size, self.shared, self.local, lambda: self.t0 + self.now, lambda: self.now)

    def second(self, every: Callable[[Any], None]) -> None:
        """One simulated second: ``every(watch)`` for each rank, then the clocks move on."""
        for watch in self.watches:
            every(watch)
        self.now += 1.0


def steady(job: Job, rounds: int) -> dict[str, Any]:
    """Every rank runs collectives and publishes once a second; what the shared folder sees."""

    def work(watch: Any) -> None:
        for _ in range(PER_SECOND):
            watch.end(watch.begin("allreduce(sum)"))
        watch.publish()

    with job.count.on() as count:
        job.second(work)  # the first second makes the files (and opens the descriptors counted after)
        count.counts.clear()
        writes = sum(n.writes for n in {id(w.node): w.node for w in job.watches}.values())
        for _ in range(rounds):
            job.second(work)
    one = stall.Watch(0, "mpi", TIMEOUT, size=job.size)  # apart from the job: its collectives do not count
    one.watchers = [stall.RecordedWaits()]  # as RING's and NCCL's records carry the waits
    for _ in range(stall.PUBLISHED_WAITS):  # a long run's history, as the records would carry it
        one.end(one.begin("allreduce(sum)"))
    with_waits = len(nodes.encode(asdict(one.record(job.now))))
    node_list = {id(w.node): w.node for w in job.watches}.values()
    written = sum(n.writes for n in node_list) - writes
    files = os.listdir(job.shared)
    size = sum((job.shared / f).stat().st_size for f in files)
    return {
        "records_per_s": round(written * RANKS_PER_NODE / rounds),
        "node_files_per_s": round(written / rounds),
        "metadata_per_s": round(count.metadata() / rounds, 1),
        "files": len(files),
        "bytes_per_record": round(size / job.size),
        "bytes_with_waits": with_waits,
        "counts_per_s": {k: round(v / rounds, 1) for k, v in count.counts.items()},
    }


def stuck(job: Job, rank: int) -> dict[str, Any]:
    """Rank ``rank`` never reaches the next all-reduce; every other rank waits, and looks once a second."""
    for watch in job.watches:
        if watch.rank != rank:
            watch.begin("allreduce(sum)")
    job.second(lambda w: w.publish())
    job.now += TIMEOUT  # the waits pass the timeout (their node files keep being rewritten meanwhile)
    job.second(lambda w: w.publish())
    read = [0]
    real_read_nodes = nodes.read_nodes

    def counted(shared: Path, names: list[str]) -> list[dict[str, Any]]:
        found = real_read_nodes(shared, names)
        read[0] += len(found)
        return found

    nodes.read_nodes = counted  # type: ignore[assignment]
    waiting = {w.rank: w for w in job.watches if w.rank != rank}
    named: dict[int, str] = {}
    started, seconds = time.perf_counter(), 0
    try:
        with job.count.on() as count:
            while len(named) < len(waiting) and seconds < 60:
                for r, watch in waiting.items():
                    if r not in named and (line := watch.overdue()):
                        named[r] = line
                job.now += 1.0
                seconds += 1
    finally:
        nodes.read_nodes = real_read_nodes  # type: ignore[assignment]
    took = time.perf_counter() - started
    right = sum(line.startswith(f"rank {rank} has not reached collective") for line in named.values())
    tracemalloc.start()
    records = progress.read(job.shared)
    stall_lines.late_lines(0, 3, "allreduce(sum)", TIMEOUT, records, job.size, job.shared)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {
        "record_reads": read[0],
        "named_after_s": seconds,
        "all_named_right": right == len(waiting),
        "cpu_s": round(took, 2),
        "reader_mb": round(peak / 2**20, 1),
        "metadata": count.metadata(),
    }


#: ``mldist stacks`` in a child that reports its own peak memory (``VmHWM``: the memory of this process since its
#: exec; ``ru_maxrss`` would count the benchmark's own, which the child shares until it execs).
_STACKS = """
import contextlib, io, re, sys
from mldist.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    main(["stacks", sys.argv[1]])
peak = re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read())
print(len(out.getvalue().splitlines()), int(peak.group(1)) if peak else 0)
"""


def stacks(folder: Path) -> dict[str, Any]:
    """``mldist stacks FOLDER`` in a new Python, as a user runs it: seconds (CPU seconds), peak memory, lines."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _STACKS, str(folder)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    out = proc.stdout.read() if proc.stdout else ""
    _, _, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - started
    proc.returncode = 0
    lines, peak = (int(x) for x in (out.split() or ["0", "0"])[-2:])
    cpu = usage.ru_utime + usage.ru_stime
    return {"stacks_s": round(took, 2), "stacks_cpu_s": round(cpu, 2), "stacks_mb": round(peak / 1024, 1),
            "stacks_lines": lines}  # fmt: skip


def joins(size: int, base: Path) -> dict[str, Any]:
    """N ranks mark their join and look for ranks that ended alone; then each notes how it ended."""
    where = base / "joins"
    where.mkdir()
    with Counting(where).on() as count:
        for rank in range(size):
            joined.mark(where, rank, "run", "train.py:12")
            joined.ended(where, "run")
        for rank in range(size):
            joined.write(where, rank, "mldist.init", "run")
    messages = sum(len(mpi_exit.told(rank, size)) for rank in range(size))
    return {"join_metadata": count.metadata(), "join_listings": count.counts["listing"],
            "join_fsyncs": count.counts["fsync"], "exit_messages": messages}  # fmt: skip


def row(size: int, rounds: int) -> dict[str, Any]:
    """Every figure for ``size`` ranks."""
    base = Path(tempfile.mkdtemp(prefix=f"mldist-scale-{size}-"))
    try:
        job = Job(size, base)
        out: dict[str, Any] = {"ranks": size, "nodes": size // RANKS_PER_NODE}
        out |= steady(job, rounds)
        out |= stuck(job, size // 2 + 1)
        out |= stacks(job.shared)
        out |= joins(size, base)
        for watch in job.watches:
            watch.node.close()
        return out
    finally:
        shutil.rmtree(base, ignore_errors=True)


def straggler_rows(ranks: list[int]) -> list[dict[str, Any]]:
    """The slow-rank account's rows (``benchmarks/scale_straggler.py``'s ``rows``), if that file is there."""
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import scale_straggler  # type: ignore[import-not-found]
    except ImportError:
        return []
    found: list[dict[str, Any]] = scale_straggler.rows(ranks)
    return found


def table(found: list[dict[str, Any]]) -> str:
    """The figures as a Markdown table, goals in the last row."""
    heads = ["ranks", "nodes", "records/s", "node files/s", "metadata ops/s", "files", "bytes/record",
             "reads (1 stuck)", "named after (s)", "reader MB", "stacks s (CPU s)", "stacks MB", "join metadata ops",
             "join listings", "exit messages"]  # fmt: skip
    keys = ["ranks", "nodes", "records_per_s", "node_files_per_s", "metadata_per_s", "files", "bytes_per_record",
            "record_reads", "named_after_s", "reader_mb", "stacks", "stacks_mb", "join_metadata", "join_listings",
            "exit_messages"]  # fmt: skip
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    found = [r | {"stacks": f"{r['stacks_s']} ({r['stacks_cpu_s']})"} for r in found]
    lines += [
        "| " + " | ".join(f"{r[k]:,}" if isinstance(r[k], int) else str(r[k]) for k in keys) + " |" for r in found
    ]
    goal = ["goal", "", "", "", "<= 2,000", "nodes", "", "<= 4 N", "<= 30", "<= 200", "<= 2", "<= 300", "O(N)", "0",
            "O(N)"]  # fmt: skip
    return "\n".join([*lines, "| " + " | ".join(goal) + " |"])


def main(argv: list[str] | None = None) -> int:
    """Print the table (or JSON) for the rank counts asked."""
    parser = argparse.ArgumentParser(prog="scale.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="256,1024", help="comma-separated rank counts, multiples of 4 "
                        "(default 256,1024; the issue's set: 256,1024,4096,16384)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="simulated seconds of steady state (default 3)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--no-straggler", action="store_true", help="leave out the slow-rank account's rows")
    args = parser.parse_args(argv)
    try:
        ranks = [int(x) for x in args.ranks.split(",")]
        if any(r < 8 or r % RANKS_PER_NODE for r in ranks) or args.rounds < 1:
            raise ValueError
    except ValueError:
        print(f"scale.py: error: --ranks {args.ranks!r} --rounds {args.rounds}: give rank counts of 8 or more, "
              "multiples of 4, comma-separated (e.g. 256,1024), and 1 round or more", file=sys.stderr)  # fmt: skip
        return 2
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 2 descriptors a simulated node
    found = [row(size, args.rounds) for size in ranks]
    slow = [] if args.no_straggler else straggler_rows(ranks)
    if args.json:
        print(json.dumps({"control_plane": found, "straggler": slow}, indent=1))
        return 0
    print(table(found))
    for r in slow:
        print("straggler: " + ", ".join(f"{k}={v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
