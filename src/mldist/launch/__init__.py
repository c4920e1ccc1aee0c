"""Starting workers: ``local`` runs N processes on this host (``mldist run``),
``batch`` writes and follows scheduler jobs (``mldist submit``)."""
