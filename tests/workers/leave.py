"""A 2-rank worker that leaves in one of many ways: ``python leave.py WAY FD2``.

WAY (rank 1 leaves after one all-reduce, unless said otherwise):
  sysexit  sys.exit(3)
  raise    an uncaught ValueError
  osexit   os._exit(3)
  kill     kill -9 of itself
  exit0    sys.exit(0) while rank 0 still runs all-reduces
  stall    rank 1 never reaches rank 0's next all-reduce (run with MLDIST_COLLECTIVE_TIMEOUT=3)
  clean    both ranks run 3 all-reduces and end with exit 0
FD2: "keep", "before" (fd 2 points to a file before mldist.init(), as under pytest's capture) or
"after" (a logging setup moves fd 2 to a file after mldist.init()).
Other ranks sleep (never reaching a collective) unless the way needs them in one.
"""

import os
import sys
import tempfile
import time


def redirect_fd2() -> None:
    fd = os.open(os.path.join(tempfile.mkdtemp(), "stderr.txt"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.dup2(fd, 2)
    os.close(fd)


way, fd2 = sys.argv[1], sys.argv[2]
if fd2 == "before":
    redirect_fd2()

import tensorflow as tf  # noqa: E402

import mldist  # noqa: E402

ctx = mldist.init()
if fd2 == "after":
    redirect_fd2()
print(f"rank {ctx.rank} engine {ctx.communication}", flush=True)
mldist.allreduce(tf.ones([4]), op="sum")
if ctx.rank == 1:
    if way == "sysexit":
        sys.exit(3)
    if way == "raise":
        raise ValueError("boom")
    if way == "osexit":
        os._exit(3)
    if way == "kill":
        os.kill(os.getpid(), 9)
    if way == "exit0":
        sys.exit(0)
    if way == "stall":
        time.sleep(300)
if way in ("exit0", "stall", "clean"):
    for _ in range(3):
        time.sleep(0.5 if ctx.rank == 0 else 0)
        mldist.allreduce(tf.ones([4]), op="sum")
    print(f"rank {ctx.rank} finished", flush=True)
else:
    time.sleep(300)
