"""Tools on top of the runtime: report (``mldist env``), doctor, checks, tensorboard, bench, steptime."""
