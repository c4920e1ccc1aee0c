"""A worker of ``horovod.run``: ``python -m mldist.horovod.runner DIRECTORY [--alias]``."""

import sys

from . import _worker

_worker(sys.argv[1], "--alias" in sys.argv[2:])
