"""The engines behind one interface (``engine``: a small protocol with capability flags): MPI
(``mpi_*``: world, exit, joins, waits, progress, host collectives, node tiers), TensorFlow's
collectives (``tf_engine``) and JAX's runtime (``jax_*``), with the group subsets they share.

It may import :mod:`mldist.base`, :mod:`mldist.placement`, ``runtime.context``/``runtime.compat`` and
:mod:`mldist.runtime.watch`; never start-up or collectives. A new engine is one module here.

Example::

    from mldist.runtime.engines import engine
    flags = engine.running()
"""
