"""What a training step calls: collectives (``collectives``) in the caller's types
(``host_values``), fused buckets (``buckets``), gradient averaging (``gradients``) and the timelines
of chosen steps (``profiling``).

It may import everything else in :mod:`mldist.runtime`; only the package itself imports it.

Example::

    from mldist.runtime.collect import collectives
    total = collectives.allreduce(1.0, op="sum")
"""
