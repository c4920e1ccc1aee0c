"""Who is late, where, and how a worker leaves: the stalled-collective watch (``stall``), the one
reader's verdict (``verdict``) and its lines (``stall_lines``), the straggler tracker (``straggler*``),
the watch on the launcher (``watchdog``), JAX's sampled computations (``jax_watch``), stack frames
(``frames``), failure explanations (``failures``) and the one exit path (``leave``).

It may import :mod:`mldist.base`, :mod:`mldist.placement` and ``runtime.context``/``runtime.compat``;
never the engines, start-up or collectives (an engine registers with the watch, not the reverse).

Example::

    from mldist.runtime.watch import stall
"""
