"""Small generated stand-ins of the cached dataset files, in the real formats, and a loopback mirror.

mnist.npz            NumPy npz of x_train, y_train, x_test, y_test (uint8)
*-idx?-ubyte.gz      Fashion-MNIST's gzipped IDX files
cifar-10-python.tar  CIFAR-10's pickled batches in cifar-10-batches-py/
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import re
import struct
import tarfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import numpy as np


def sha256(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def mnist_arrays(n_train: int, n_test: int, seed: int = 0) -> dict[str, np.ndarray]:
    """MNIST-shaped uint8 arrays whose label is learnable: the brightest of 10 horizontal bands."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        y = rng.integers(0, 10, n).astype(np.uint8)
        x = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
        for i, label in enumerate(y):
            x[i, 2 + 2 * label : 4 + 2 * label, :] = 255
        out[f"x_{split}"], out[f"y_{split}"] = x, y
    return out


def mnist_npz(n_train: int = 64, n_test: int = 16, seed: int = 0) -> bytes:
    """The bytes of an ``mnist.npz`` like Keras's, with ``n_train`` and ``n_test`` examples."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **mnist_arrays(n_train, n_test, seed))  # type: ignore[arg-type]
    return buffer.getvalue()


def idx_gz(array: np.ndarray) -> bytes:
    """A gzipped IDX file of a uint8 array."""
    header = b"\0\0\x08" + bytes([array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return gzip.compress(header + array.astype(np.uint8).tobytes())


def fashion_files(n_train: int = 32, n_test: int = 8) -> dict[str, bytes]:
    """Fashion-MNIST's four files, generated."""
    a = mnist_arrays(n_train, n_test, seed=1)
    return {
        "train-labels-idx1-ubyte.gz": idx_gz(a["y_train"]),
        "train-images-idx3-ubyte.gz": idx_gz(a["x_train"]),
        "t10k-labels-idx1-ubyte.gz": idx_gz(a["y_test"]),
        "t10k-images-idx3-ubyte.gz": idx_gz(a["x_test"]),
    }


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return (os.getcwd, ())  # harmless, but a global no CIFAR batch has


def cifar_tar(per_batch: int = 4, evil: bool = False) -> bytes:
    """``cifar-10-python.tar.gz`` with ``per_batch`` images in each of the 6 batches (pixel value = batch)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for index, name in enumerate([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]):
            data = np.zeros((per_batch, 3072), np.uint8)
            data[:, :1024] = index  # the red plane of every image
            batch: dict[bytes, Any] = {b"data": data, b"labels": [index] * per_batch, b"batch_label": name.encode()}
            if evil:
                batch[b"extra"] = _Evil()
            raw = pickle.dumps(batch, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return buffer.getvalue()


def write(folder: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` (name to bytes) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)


@dataclass
class Mirror:
    """A file server on 127.0.0.1 with Range support.

    Args:
        url: the base URL (give it to ``--mirror``).
        files: file name to bytes, served at ``url + name``.
        requests: ``(path, Range header or None)`` of every GET, in order.
        cut_next: this many next responses announce the full length but send half and close.
    """

    url: str = ""
    files: dict[str, bytes] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    cut_next: int = 0


def mirror_handler(state: Mirror) -> type[BaseHTTPRequestHandler]:
    """A request handler class serving ``state``'s files."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            wanted = self.headers.get("Range")
            state.requests.append((self.path, wanted))
            body = state.files.get(self.path.rsplit("/", 1)[-1])
            if body is None:
                self.send_error(404)
                return
            start = int(m.group(1)) if wanted and (m := re.fullmatch(r"bytes=(\d+)-", wanted)) else 0
            if start >= len(body) > 0:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            rest = body[start:]
            self.send_header("Content-Length", str(len(rest)))
            self.send_header("Connection", "close")
            self.end_headers()
            if state.cut_next:
                state.cut_next -= 1
                rest = rest[: len(rest) // 2]
            self.wfile.write(rest)
            self.wfile.flush()
            self.close_connection = True

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler
