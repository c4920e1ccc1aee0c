"""Tools on top of the runtime: the ``mldist env`` report (report)."""
