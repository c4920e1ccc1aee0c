"""horovod.run(fn, hosts=..., min_np=2) on 3 test hosts, Horovod's ObjectState loop; prints RESULT.

Usage: hvd_run_elastic.py HOSTS

Each epoch all-reduces the ranks' counts and commits. In the first world, the worker on the last
rank ends itself with exit code 3 once epoch 1 is committed (its host still answers: Horovod leaves
out the host whose worker failed); the world re-forms on the others and goes on from the commit.
The results are those of the world that finished.
"""

from __future__ import annotations

import json
import os
import sys

import horovod


def train(epochs: int) -> dict[str, object]:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    state = hvd.elastic.ObjectState(epoch=0, total=0)
    started = {"epoch": -1}

    @hvd.elastic.run
    def loop(state: hvd.elastic.ObjectState) -> None:
        started["epoch"] = state.epoch if started["epoch"] < 0 else started["epoch"]
        while state.epoch < epochs:
            state.total += int(hvd.allreduce(tf.constant(1), op=hvd.Sum))
            state.epoch += 1
            state.commit()
            if os.environ.get("MLDIST_RESTART", "0") == "0" and state.epoch == 2 and hvd.rank() == hvd.size() - 1:
                os._exit(3)

    loop(state)
    return {"rank": hvd.rank(), "size": hvd.size(), "first_epoch": started["epoch"], "total": state.total}


results = horovod.run(train, args=(5,), np=3, hosts=sys.argv[1], min_np=2, use_mpi=True)
print("RESULT " + json.dumps(results), flush=True)
