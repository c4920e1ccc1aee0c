"""horovod.run(fn, np=2) as a Horovod user writes it (run through the import alias): prints RESULT."""

from __future__ import annotations

import json

import horovod


def train(scale: int, offset: int = 0) -> dict[str, int]:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    total = int(hvd.allreduce(tf.constant(hvd.rank() + 1), op=hvd.Sum))
    return {"rank": hvd.rank(), "value": hvd.rank() * scale + offset, "total": total}


results = horovod.run(train, args=(10,), kwargs={"offset": 1}, np=2, use_mpi=True)
try:  # an elastic world loses hosts: on this host alone horovod.run says so in one line
    horovod.run(train, args=(10,), np=2, min_np=1)
    elastic = "accepted"
except Exception as exc:  # mldist's UnsupportedError: the test reads its name
    elastic = f"{type(exc).__name__}: {exc}"
print("RESULT " + json.dumps({"results": results, "elastic": elastic}), flush=True)
