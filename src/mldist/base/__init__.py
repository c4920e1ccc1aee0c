"""The bottom of the tree, below placement: what every stage may use, with no mldist import but errors.

``files`` writes files durably (temp file, fsync, rename); ``rundir`` holds the run
directory's names and writers that the launcher, the workers and the tools share;
``procs`` the process helpers of the launcher that the tools need too (free ports,
dying with the parent, TensorFlow's start-up noise).

Example:
    >>> from mldist.base.rundir import run_name
    >>> run_name(["python", "train.py"])
    'train'
"""
