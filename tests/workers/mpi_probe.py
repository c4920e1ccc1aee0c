"""One RESULT line per rank: engine, world, node, an all-reduce's value and its TCP connections.

``python mpi_probe.py``: after ``mldist.init()`` and one all-reduce of a 4 MB tensor, each rank
lists its established TCP connections as "local>remote" endpoints (Open MPI connects lazily:
two ranks that talk over TCP hold the two ends of one connection; ranks that share memory
hold none between them) and the endpoints it listens on (hex, as /proc/net/tcp has them).
"""

import json
import os
from pathlib import Path

import tensorflow as tf

import mldist


def tcp(state: str) -> list[str]:
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == state and cols[9] in inodes:  # 01: ESTABLISHED, 0A: LISTEN
                found.append(f"{cols[1]}>{cols[2]}")
    return found


ctx = mldist.init()
total = mldist.allreduce(tf.fill([1 << 20], float(ctx.rank + 1)), op="sum")
row = {
    "rank": ctx.rank,
    "size": ctx.size,
    "engine": ctx.communication,
    "node": os.environ.get("SLURMD_NODENAME") or os.uname().nodename,
    "sum": float(total[0]),
    "tcp": tcp("01"),
    "listen": [c.split(">")[0] for c in tcp("0A")],
    "tcp_if_include": os.environ.get("OMPI_MCA_btl_tcp_if_include"),  # noqa: SIM112 - Open MPI spells it so
}
print("RESULT " + json.dumps(row), flush=True)
