"""Worker: the slow-rank rounds over the engine's own channel, with ranks out of step.

Each rank posts ROUNDS rounds (rank 1 two more: a rank whose watch thread turned more often), round i
holding collectives 1 .. 3i + 3 with its rank as its wait; rank 0 collects and prints what paired. Every
rank then leaves at once: a round still open must not hold the job at its end. Prints ``PAIRED ...`` at
rank 0 and ``DONE rank`` everywhere. Run it with ``MLDIST_STRAGGLER_PERCENT=0``: the watch's own rounds
would share the channel.
"""

from __future__ import annotations

import sys
import time

import mldist
from mldist.runtime.engines import engine
from mldist.runtime.watch import straggler_gather

ctx = mldist.init()
eng = engine.running()
aside = eng.aside(ctx.rank, ctx.size)
rounds = int(sys.argv[1]) + (2 if ctx.rank == 1 else 0)
pool = straggler_gather.Pool(ctx.size, straggler_gather.slots(ctx.size))
paired: list[int] = []
for i in range(rounds):  # each round repeats the earlier ones' collectives (as a round of JAX's does the last)
    entries = [(n, float(ctx.rank), 0.5) for n in range(1, 3 * i + 4)]
    aside.post(straggler_gather.row(f"host{ctx.rank}", "", entries, ctx.size))
if ctx.rank == 0:
    deadline = time.monotonic() + 60
    while not paired and time.monotonic() < deadline:
        for got in aside.collect(wait=0.2):
            paired += pool.add(got)[0].tolist()
    print("PAIRED", eng.gathers_aside, paired, flush=True)
print("DONE", ctx.rank, flush=True)
