"""Who am I and where are the others: pure functions of an environment mapping.

``detect`` reads the launcher's variables into a ``Placement`` (``hostlist``
expands Slurm-style host lists); ``cluster`` turns it into every rank's address;
``resources`` plans threads, GPUs and proxies; ``engines`` decides the collective
engine and ``backend`` the Keras backend. Nothing here imports TensorFlow or
changes the process.

Example:
    >>> from mldist.placement import detect
    >>> detect({"MLDIST_RANK": "1", "MLDIST_SIZE": "2"}).rank
    1
"""

from __future__ import annotations

from .cluster import ClusterSpec, build_cluster_spec, no_discovery
from .detect import Placement, detect

__all__ = ["ClusterSpec", "Placement", "build_cluster_spec", "detect", "no_discovery"]
