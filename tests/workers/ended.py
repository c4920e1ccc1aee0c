"""Worker: a rank that publishes where it is as mldist.init()'s watch does, stops publishing, and ends.

Usage: ended.py SECONDS [FAILING_RANK]. Each rank finishes three collectives, begins a fourth
(``allreduce(sum)``) and writes its record into the progress folder ``mldist run`` names, through
the watch's own code (:class:`mldist.runtime.watch.stall.Watch`, once, from another thread as the
watch's thread does; nothing more is written). It prints ``PUBLISHED``, sleeps SECONDS (the
record ages), then FAILING_RANK exits 1 and the others 0. No TensorFlow: two small processes.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from mldist.base import progress
from mldist.runtime.watch.stall import Watch

rank = int(os.environ["MLDIST_RANK"])
watch = Watch(rank, "mpi", 600.0, size=int(os.environ["MLDIST_SIZE"]), where=progress.folder(os.environ))
for _ in range(3):
    watch.end(watch.begin("allreduce(sum)"))
watch.begin("allreduce(sum)")  # in flight when the run ends


def publish_once() -> None:
    """As the watch's thread does, while the main thread waits below."""
    time.sleep(0.3)
    watch.publish()
    print("PUBLISHED", rank, flush=True)


threading.Thread(target=publish_once).start()
time.sleep(float(sys.argv[1]))  # waiting in the collective
sys.exit(1 if len(sys.argv) > 2 and rank == int(sys.argv[2]) else 0)
