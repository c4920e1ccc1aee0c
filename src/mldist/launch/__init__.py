"""Starting workers: ``local`` runs N processes on this host (``mldist run``),
``batch`` writes and follows scheduler jobs (``mldist submit``).

Bottom up: ``config`` (RunConfig), ``procs`` (worker environments, CPU sets, exit
reports), ``groups`` (workers started directly; ``output``: their output relayed and
logged), ``mpiexec`` and ``shim`` (under
mpiexec), ``remote`` and ``remote_shim`` (other hosts, ``-H``), ``netns`` (a private
network), ``rundir`` (config.json and summary.json), ``rounds`` (one round of workers, supervised)
and ``local`` (the rounds of a run: a plain loop, the elastic supervisor for elastic runs).
What the workers and tools share with the launcher is below it, in :mod:`mldist.base`.
"""
