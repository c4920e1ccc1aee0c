"""What Horovod's own Keras tests read of its DistributedOptimizer, on 2 ranks under TF-Keras
(TF_USE_LEGACY_KERAS=1), written as those tests use it.

- ``_compute_gradients(loss, var_list)`` returns the ranks' average; ``apply_gradients`` of those
  pairs does not reduce again.
- With ``backward_passes_per_step=2``: ``_agg_helper.counter`` counts the passes since the last
  apply, ``iterations`` counts every call, and the variables move once every 2 calls by the sum
  (or, with ``average_aggregated_gradients``, the mean) of the passes' averaged gradients.
- A subclass of ``tf.keras.optimizers.Optimizer`` in the user's own module is wrapped too.

Prints RESULT {rank, reduced, applied, steps}.
"""

from __future__ import annotations

import json

import tensorflow as tf

import mldist.horovod.tensorflow.keras as hvd

hvd.init()
r = hvd.rank()


class AddGradient(tf.keras.optimizers.Optimizer):
    """Adds the gradient to the variable: what it applied is readable in the variable."""

    def __init__(self, name: str = "add", **kwargs: object) -> None:
        super().__init__(name=name, **kwargs)
        self._learning_rate = self._build_learning_rate(0.1)  # tf_keras's base class reads it

    def update_step(self, gradient: tf.Tensor, variable: tf.Variable) -> None:
        variable.assign_add(gradient)


x = tf.Variable([0.0])
opt = hvd.DistributedOptimizer(AddGradient())
pairs = opt._compute_gradients(lambda: x * float(r + 1), var_list=[x])  # gradients 1 and 2: mean 1.5
reduced = float(pairs[0][0][0])
opt.apply_gradients(pairs)
applied = float(x[0])  # 1.5 once, not reduced twice

steps = {}
for average in (False, True):
    y = tf.Variable([0.0])
    agg = hvd.DistributedOptimizer(AddGradient(), backward_passes_per_step=2, average_aggregated_gradients=average)
    seen = []
    for _ in range(3):
        agg.apply_gradients(agg._compute_gradients(lambda v=y: v * float(r + 1), var_list=[y]))
        seen.append([float(y[0]), int(agg._agg_helper.counter), int(agg.iterations)])
    steps[str(average)] = seen
print("RESULT " + json.dumps({"rank": r, "reduced": reduced, "applied": applied, "steps": steps}), flush=True)
