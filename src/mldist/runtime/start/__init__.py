"""A worker's start: ``init`` (``worker``), the start-up hook's work (``startup``), TensorFlow's
early start (``tf_start``) and every process-wide change with its reason and switch
(``patches.PATCHES``).

It may import everything below it in :mod:`mldist.runtime` (``context``, ``compat``, ``watch``,
``engines``); never the collectives.

Example::

    from mldist.runtime.start import worker
    ctx = worker.init()
"""
