"""A numpy-only data-parallel job for --stage-env: linear regression by gradient descent, gradients summed with MPI.

Deterministic: each rank's shard comes from its own seed; the reduction is MPI's sum of two
float64 arrays (the same order every run). Every rank writes ``result-rank{R}.json`` in OUT: the
weights (repr, bit-exact), the loss, and where its Python and numpy came from (to tell a staged
run from one on the shared file system).

usage: python staged_numpy.py OUT [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import mldist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    mldist.init()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    truth = np.arange(1.0, 9.0)
    rng = np.random.default_rng(1234 + rank)
    x = rng.normal(size=(256, truth.size))
    y = x @ truth + 0.01 * rng.normal(size=256)
    w = np.zeros_like(truth)
    for _ in range(args.steps):
        grad = 2.0 * x.T @ (x @ w - y) / len(y)
        total = np.empty_like(grad)
        comm.Allreduce(grad, total, op=MPI.SUM)
        w -= 0.05 * total / size
    loss = float(np.mean((x @ w - y) ** 2))
    record = {
        "rank": rank, "size": size, "weights": [repr(float(v)) for v in w], "loss": repr(loss),
        "executable": sys.executable, "prefix": sys.prefix, "numpy": np.__file__, "mldist": mldist.__file__,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"result-rank{rank}.json").write_text(json.dumps(record, indent=1))
    print(f"rank {rank} of {size}: loss {loss:.6f} (python {sys.executable})", flush=True)


if __name__ == "__main__":
    main()
