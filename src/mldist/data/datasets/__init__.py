"""Datasets for offline clusters: fetch once on a login node, load from the cache in jobs.

Compute nodes often have no internet access, so ``keras.datasets`` cannot download there.
``mldist data fetch NAME`` (on a login node) downloads each file of a dataset into the cache,
resumably, checks its SHA-256 and only then renames it into place (fetch); ``load`` reads only
the cache and returns NumPy arrays as ``keras.datasets`` does (readers). The table of datasets
and the cache's place are in table, the record of checked files in cache.

The cache is ``--cache DIR``, else ``MLDIST_DATA_DIR``, else ``~/.cache/mldist/data``, with one
folder per dataset (``mnist/mnist.npz``).

Example::

    $ mldist data fetch mnist          # on the login node
    (x_train, y_train), (x_test, y_test) = mldist.data.load("mnist")   # in the job
"""

from __future__ import annotations

from .cache import Cached, cached, sha256_of, status
from .fetch import DownloadError, fetch
from .readers import load
from .table import DATASETS, ENV_CACHE, Dataset, cache_dir, dataset, fetch_command

__all__ = [
    "DATASETS",
    "ENV_CACHE",
    "Cached",
    "Dataset",
    "DownloadError",
    "cache_dir",
    "cached",
    "dataset",
    "fetch",
    "fetch_command",
    "load",
    "sha256_of",
    "status",
]
