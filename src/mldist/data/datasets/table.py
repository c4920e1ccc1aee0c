"""The dataset table (files, default URLs, SHA-256) and where the cache is.

Example:
    >>> dataset("mnist").files[0][0]
    'mnist.npz'
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from ...base import envvalues
from ...errors import ConfigError

#: Keras's public mirror of MNIST and Fashion-MNIST (the files ``keras.datasets`` downloads).
KERAS_MIRROR = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/"
#: Where ``keras.datasets.cifar10`` downloads CIFAR-10 from (the dataset authors' site).
CIFAR_SITE = "https://www.cs.toronto.edu/~kriz/"
#: The record of checked files in each dataset folder.
MANIFEST = "sha256.json"
#: The environment variable naming the cache (after ``--cache``).
ENV_CACHE = envvalues.DATA_DIR.name


@dataclass(frozen=True)
class Dataset:
    """One entry of the dataset table.

    Args:
        name: what ``fetch`` and ``load`` take.
        title: one line for ``mldist data list``.
        base_url: the default location; a file's URL is ``base_url + file name``.
        files: ``(file name, sha256)`` of every file, in download order.
    """

    name: str
    title: str
    base_url: str
    files: tuple[tuple[str, str], ...]


DATASETS: dict[str, Dataset] = {
    d.name: d
    for d in (
        Dataset(
            "mnist",
            "MNIST handwritten digits, 28x28 grey, 60000 train / 10000 test",
            KERAS_MIRROR,
            (("mnist.npz", "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"),),
        ),
        Dataset(
            "fashion_mnist",
            "Fashion-MNIST clothing, 28x28 grey, 60000 train / 10000 test",
            KERAS_MIRROR,
            (
                ("train-labels-idx1-ubyte.gz", "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845"),
                ("train-images-idx3-ubyte.gz", "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84"),
                ("t10k-labels-idx1-ubyte.gz", "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5"),
                ("t10k-images-idx3-ubyte.gz", "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073"),
            ),
        ),
        Dataset(
            "cifar10",
            "CIFAR-10 objects, 32x32 colour, 50000 train / 10000 test",
            CIFAR_SITE,
            (("cifar-10-python.tar.gz", "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"),),
        ),
    )
}

#: A SHA-256 as ``--sha256`` takes it (lower case after folding).
SHA256 = re.compile(r"[0-9a-f]{64}")


def dataset(name: str) -> Dataset:
    """The table entry of ``name`` (``fashion-mnist`` works for ``fashion_mnist``).

    Example:
        >>> dataset("fashion-mnist").files[0][0]
        'train-labels-idx1-ubyte.gz'
    """
    found = DATASETS.get(name.strip().lower().replace("-", "_"))
    if found is None:
        raise ConfigError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    return found


def cache_dir(cache: str | os.PathLike[str] | None = None) -> Path:
    """The data cache: ``cache``, else ``$MLDIST_DATA_DIR``, else ``~/.cache/mldist/data``.

    Example:
        >>> cache_dir("/scratch/data")
        PosixPath('/scratch/data')
    """
    chosen = cache if cache is not None else envvalues.DATA_DIR.read(os.environ) or "~/.cache/mldist/data"
    return Path(chosen).expanduser().absolute()


def usable_cache_dir(cache: str | os.PathLike[str] | None = None, flag: str = "cache") -> Path:
    """:func:`cache_dir`, once it can be a data cache (a directory, or one that can be made); else a ConfigError.

    A file given as the cache would make every dataset look absent and every fetch fail.

    Args:
        cache: as :func:`cache_dir`.
        flag: how the caller names ``cache`` in the message (``--cache`` on the command line).

    Example:
        >>> usable_cache_dir("/etc/passwd")
        Traceback (most recent call last):
        ...
        mldist.errors.ConfigError: cache '/etc/passwd' is a file, not a directory: name a directory
    """
    root = cache_dir(cache)
    given = flag if cache is not None else ENV_CACHE if envvalues.DATA_DIR.read(os.environ) else "the data cache"
    existing = next(p for p in (root, *root.parents) if os.path.lexists(p))
    if existing.is_dir():
        return root
    if existing == root:
        raise ConfigError(f"{given} {str(root)!r} is a file, not a directory: name a directory")
    raise ConfigError(
        f"{given} {str(root)!r}: {existing} is a file, so no directory can be made below it; name a directory"
    )


def fetch_command(name: str, root: Path) -> str:
    """The exact command that fills cache ``root`` with dataset ``name``.

    Example:
        >>> fetch_command("mnist", Path("/scratch/my data"))
        "mldist data fetch mnist --cache '/scratch/my data'"
    """
    return f"mldist data fetch {name} --cache {shlex.quote(str(root))}"
