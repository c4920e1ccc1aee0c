"""Reading a fetched dataset from the cache into NumPy arrays, as ``keras.datasets`` returns them.

Only the cache is read: a missing file is a one-line ConfigError naming the fetch command.

Example::

    (x_train, y_train), (x_test, y_test) = load("mnist")
"""

from __future__ import annotations

import contextlib
import gzip
import os
import pickle
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from .table import DATASETS, dataset, fetch_command, usable_cache_dir


def _read_mnist(folder: Path) -> Any:
    import numpy as np

    with np.load(folder / "mnist.npz", allow_pickle=False) as f:
        return (f["x_train"], f["y_train"]), (f["x_test"], f["y_test"])


def _idx(path: Path) -> Any:
    """The array in an IDX file (gzipped): magic 0x0000 0x08 (uint8) NDIM, then NDIM big-endian sizes."""
    import numpy as np

    raw = gzip.decompress(path.read_bytes())
    if raw[:3] != b"\0\0\x08":
        raise ValueError("not an IDX file of unsigned bytes")
    ndim = raw[3]
    shape = tuple(int(n) for n in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _read_fashion(folder: Path) -> Any:
    y_train, x_train, y_test, x_test = (_idx(folder / f) for f, _ in DATASETS["fashion_mnist"].files)
    return (x_train, y_train), (x_test, y_test)


def _unpickle(raw: bytes) -> Any:
    """A CIFAR batch: a pickled dict of lists and NumPy arrays; any other global is refused."""
    import importlib
    import io

    allowed = {"_reconstruct", "ndarray", "dtype", "scalar", "_frombuffer"}  # NumPy's, to rebuild arrays

    class Restricted(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) == ("_codecs", "encode"):  # bytes in protocol-2 pickles written by Python 3
                return super().find_class(module, name)
            if module.split(".")[0] != "numpy" or name not in allowed:
                raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
            with contextlib.suppress(ImportError, AttributeError):  # NumPy 2 moved numpy.core to numpy._core
                return getattr(importlib.import_module(module.replace("numpy.core", "numpy._core")), name)
            return getattr(importlib.import_module(module), name)

    return Restricted(io.BytesIO(raw), encoding="bytes").load()


def _read_cifar10(folder: Path) -> Any:
    import numpy as np

    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    batches = {}
    with tarfile.open(folder / "cifar-10-python.tar.gz", "r:gz") as tar:
        for member in tar:
            base = member.name.rsplit("/", 1)[-1]
            fh = tar.extractfile(member) if base in names else None
            if fh is not None:
                batches[base] = _unpickle(fh.read())
    missing = [n for n in names if n not in batches]
    if missing:
        raise ValueError(f"the archive has no {missing[0]}")

    def arrays(parts: list[dict[bytes, Any]]) -> tuple[Any, Any]:
        x = np.concatenate([np.asarray(p[b"data"], np.uint8) for p in parts]).reshape(-1, 3, 32, 32)
        y = np.concatenate([np.asarray(p[b"labels"], np.uint8) for p in parts]).reshape(-1, 1)
        return x.transpose(0, 2, 3, 1), y  # channels last, as keras.datasets.cifar10

    return arrays([batches[n] for n in names[:5]]), arrays([batches["test_batch"]])


#: What reading a damaged or foreign file raises.
_DAMAGED: tuple[type[Exception], ...] = (OSError, ValueError, EOFError, LookupError, TypeError)
_DAMAGED += (pickle.UnpicklingError, tarfile.TarError, zipfile.BadZipFile, zlib.error)

_READERS: dict[str, Callable[[Path], Any]] = {
    "mnist": _read_mnist,
    "fashion_mnist": _read_fashion,
    "cifar10": _read_cifar10,
}


def load(name: str, cache: str | os.PathLike[str] | None = None) -> Any:
    """``((x_train, y_train), (x_test, y_test))`` of dataset ``name`` from the cache only, as NumPy arrays.

    Shapes and dtypes are those of ``keras.datasets``: MNIST and Fashion-MNIST images
    ``(N, 28, 28)`` uint8 with labels ``(N,)`` uint8; CIFAR-10 ``(N, 32, 32, 3)`` with labels ``(N, 1)``.

    Args:
        name: "mnist", "fashion_mnist" or "cifar10".
        cache: the cache directory (default ``$MLDIST_DATA_DIR``, else ``~/.cache/mldist/data``).

    Example::

        (x_train, y_train), (x_test, y_test) = mldist.data.load("mnist")
    """
    ds = dataset(name)
    root = usable_cache_dir(cache)  # a file there: one line, not 'absent, run fetch'
    folder = root / ds.name
    missing = [f for f, _ in ds.files if not (folder / f).is_file()]
    if missing:
        raise ConfigError(
            f"{ds.name} is not in the data cache {root} (no {missing[0]}): run `{fetch_command(ds.name, root)}` "
            "where there is internet access (a login node)"
        )
    try:
        return _READERS[ds.name](folder)
    except _DAMAGED as exc:
        raise ConfigError(
            f"{ds.name} in {folder} is damaged ({type(exc).__name__}: {exc}); delete the folder and run "
            f"`{fetch_command(ds.name, root)}`"
        ) from None
