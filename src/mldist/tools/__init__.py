"""Tools on top of the runtime: report (``mldist env``), doctor, checks, tensorboard, bench
(with bench_worker and bench_output), steptime, runstatus (``mldist status RUN_DIR``)."""
