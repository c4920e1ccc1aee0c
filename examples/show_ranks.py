"""Smallest distributed program: every rank reports, then all ranks sum their ranks.

Run:
    python examples/show_ranks.py                  # one process
    mldist run -n 2 -- python examples/show_ranks.py
"""

from __future__ import annotations

import mldist


def main() -> None:
    ctx = mldist.init()
    import tensorflow as tf

    strategy = mldist.strategy()

    # Each rank contributes its rank; the all-reduced sum proves the collective ran.
    @tf.function
    def sum_of_ranks() -> tf.Tensor:
        value = tf.constant(float(ctx.rank))
        return strategy.reduce("SUM", strategy.run(lambda: value), axis=None)

    total = sum_of_ranks()
    print(
        f"rank {ctx.rank} of {ctx.size} (local {ctx.local_rank} of {ctx.local_size}, "
        f"launcher {ctx.launcher}): sum of ranks = {float(total):g}",
        flush=True,
    )


if __name__ == "__main__":
    main()
