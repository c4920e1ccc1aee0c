"""Downloading a dataset into the cache: resumable, checked, never a partial file under the final name.

Each file is downloaded to ``FILE.part`` beside its final name; a download that stops keeps the
part, and the next fetch asks for the rest (HTTP ``Range``). Only when the whole part has the
expected SHA-256 is it renamed to its final name; a wrong checksum deletes the part. A lock on
the dataset folder keeps two fetches from writing the same part.

Example::

    fetch("mnist")                                   # the public mirror
    fetch("mnist", mirror="https://mirror.example.org/keras-datasets/")
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from ..._version import __version__
from ...base.envparse import whole
from ...base.files import make_dirs, replace_durably
from ...errors import ConfigError, MldistError
from .cache import expected_hashes, record_sha256, recorded_sha256, sha256_of
from .table import Dataset, dataset, usable_cache_dir

CHUNK = 1 << 16


class DownloadError(MldistError):
    """A download failed or stopped early; what arrived stays in the ``.part`` file for a resume."""


def megabytes(n: float) -> str:
    """``n`` bytes as megabytes for people.

    Example:
        >>> megabytes(11_490_434)
        '11.5 MB'
    """
    return f"{n / 1e6:.1f} MB"


class Progress:
    """A progress bar on ``stream``: redrawn in place on a terminal, a line per quarter in a log.

    Args:
        stream: where to draw (None: nowhere).
        label: the file's name.
        total: its size in bytes, if the server said.
    """

    def __init__(self, stream: IO[str] | None, label: str, total: int | None) -> None:
        self.stream, self.label, self.total = stream, label, total
        self.tty = bool(stream and stream.isatty())
        self.start = time.monotonic()
        self.first: int | None = None
        self.last_draw = 0.0
        self.quarter = -1
        self.shown = -1

    def update(self, done: int, final: bool = False) -> None:
        """Show that ``done`` bytes are there (``final``: the last call)."""
        if self.first is None:
            self.first = done
        if self.stream is None:
            return
        now = time.monotonic()
        share = done / self.total if self.total else None
        quarter = int(share * 4) if share is not None else -1
        if self.tty and (final or now - self.last_draw >= 0.2):
            self.stream.write("\r" + self._line(done, share, now) + ("\n" if final else ""))
        elif not self.tty and ((final and done != self.shown) or quarter > self.quarter):
            self.stream.write(self._line(done, share, now) + "\n")
        else:
            return
        self.stream.flush()
        self.last_draw, self.quarter, self.shown = now, quarter, done

    def _line(self, done: int, share: float | None, now: float) -> str:
        rate = (done - (self.first or 0)) / max(now - self.start, 1e-3)
        if share is None:
            return f"{self.label}  {megabytes(done)}  {megabytes(rate)}/s"
        bar = "#" * int(share * 30)
        sizes = f"{megabytes(done)} / {megabytes(self.total or 0)}"
        return f"{self.label} {share:4.0%} [{bar:<30}] {sizes}  {megabytes(rate)}/s"


def base_url(ds: Dataset, mirror: str | None) -> str:
    """Where ``ds``'s files are: ``mirror`` (a URL or a directory) if given, else the table's URL.

    Example:
        >>> base_url(dataset("mnist"), "http://127.0.0.1:8000/keras")
        'http://127.0.0.1:8000/keras/'
    """
    if mirror is None:
        return ds.base_url
    if Path(mirror).is_dir():
        return Path(mirror).resolve().as_uri() + "/"
    if not re.match(r"(https?|file)://[^\s]+$", mirror):
        raise ConfigError(f"--mirror {mirror!r} is neither an http(s):// or file:// URL nor a directory")
    return mirror.rstrip("/") + "/"


def _open(url: str, start: int, timeout: float) -> Any:
    """The response to a GET of ``url`` from byte ``start``; None if the server has nothing after it."""
    request = urllib.request.Request(url, headers={"User-Agent": f"mldist/{__version__}"})
    if start:
        request.add_header("Range", f"bytes={start}-")
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and start:
            return None  # the part is complete already (or longer than the file: the checksum says)
        if exc.code in (404, 403, 401, 410):
            raise ConfigError(f"{url}: HTTP {exc.code} {exc.reason}; check --mirror") from None
        raise DownloadError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise DownloadError(f"{url}: {reason}; check the network, the proxy (https_proxy) or --mirror") from None


def _total(response: Any, start: int) -> int | None:
    """The file's full size from Content-Range or Content-Length, if the server told."""
    found = re.fullmatch(r"bytes \d+-\d+/(\d+)", response.headers.get("Content-Range", "").strip())
    if found:
        return int(found.group(1))
    length = response.headers.get("Content-Length")
    size = whole(0)(length.strip()) if length else None
    return None if size is None else start + size


def download(url: str, part: Path, timeout: float = 60.0, stream: IO[str] | None = sys.stderr) -> None:
    """Append the rest of ``url`` to ``part`` (all of it if the server ignores ``Range``).

    Args:
        url: the file's URL.
        part: the partial file (created if missing, kept when the download stops).
        timeout: seconds without data before giving up.
        stream: where the progress bar goes (None: no bar).
    """
    start = part.stat().st_size if part.is_file() else 0
    response = _open(url, start, timeout)
    if response is None:
        return
    with response:
        if start and (response.status or 200) != 206:
            start = 0  # the whole file came: start over
        total = _total(response, start)
        received = start
        bar = Progress(stream, part.name.removesuffix(".part"), total)
        with open(part, "ab" if start else "wb") as fh:
            try:
                while block := response.read(CHUNK):
                    fh.write(block)
                    received += len(block)
                    bar.update(received)
            except (OSError, http.client.HTTPException) as exc:
                raise DownloadError(f"the download of {url} broke off at {megabytes(received)}: {exc}") from None
            finally:
                fh.flush()
                os.fsync(fh.fileno())
                bar.update(received, final=True)
    if total is not None and received < total:
        raise DownloadError(
            f"the download of {url} stopped at {megabytes(received)} of {megabytes(total)} (connection closed)"
        )


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"another `mldist data fetch` is downloading into {folder}; wait for it") from None
        yield
    finally:
        os.close(fd)


def _fetch_file(url: str, final: Path, expected: str, retries: int, timeout: float, stream: IO[str] | None) -> bool:
    """Bring ``final`` into the cache unless it is there with the ``expected`` SHA-256; whether it downloaded."""
    recorded = recorded_sha256(final)
    if final.is_file() and (recorded or sha256_of(final)) == expected:
        if recorded is None:
            record_sha256(final, expected)
        return False
    _check_local(url)
    part = final.with_name(final.name + ".part")
    for attempt in range(retries + 1):
        try:
            download(url, part, timeout, stream)
            break
        except DownloadError as exc:
            if attempt == retries:
                kept = f"; {megabytes(part.stat().st_size)} kept in {part}" if part.is_file() else ""
                raise DownloadError(f"{exc}{kept}: run the same command again to resume") from None
            if stream:
                print(f"{exc}; retrying in {2**attempt} s", file=stream, flush=True)
            time.sleep(2**attempt)
    actual = sha256_of(part)
    if actual != expected:
        part.unlink()
        raise ConfigError(
            f"{final.name} from {url} has sha256 {actual}, expected {expected}; deleted it "
            "(a damaged mirror or download, or pin the right hash with --sha256)"
        )
    replace_durably(part, final)
    record_sha256(final, expected)
    return True


def _check_local(url: str) -> None:
    """A ConfigError when ``url`` is a file of a local folder (a --mirror directory) that is not there: no
    network is involved, so retries and advice about the proxy would only mislead."""
    if not url.startswith("file://"):
        return
    local = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
    if not local.is_file():
        raise ConfigError(
            f"{local.name} is not in the mirror folder {local.parent} (--mirror); put the file there, "
            "or name the folder that holds it"
        )


def fetch(
    name: str,
    cache: str | os.PathLike[str] | None = None,
    *,
    mirror: str | None = None,
    sha256: Sequence[str] = (),
    retries: int = 2,
    timeout: float = 60.0,
    stream: IO[str] | None = sys.stderr,
) -> list[tuple[Path, bool]]:
    """Download dataset ``name`` into the cache; every file with whether it was downloaded now.

    Args:
        name: "mnist", "fashion_mnist" or "cifar10".
        cache: the cache directory (default ``$MLDIST_DATA_DIR``, else ``~/.cache/mldist/data``).
        mirror: a URL (or directory) holding the files instead of the table's base URL.
        sha256: ``HASH`` (one-file datasets) or ``FILE=HASH`` each: expected checksums instead of the table's.
        retries: new attempts, each resuming, after a download broke off.
        timeout: seconds without data before an attempt gives up.
        stream: where progress and retries are reported (None: silence).

    Example::

        fetch("mnist", "/scratch/data", mirror="http://127.0.0.1:8000/")
    """
    ds = dataset(name)
    expected = expected_hashes(ds, sha256)
    base = base_url(ds, mirror)
    root = usable_cache_dir(cache)
    done = []
    try:
        folder = make_dirs(root / ds.name)
        with _locked(folder):
            for file, _ in ds.files:
                fresh = _fetch_file(base + file, folder / file, expected[file], retries, timeout, stream)
                done.append((folder / file, fresh))
    except OSError as exc:  # a read-only or full cache: the folder, the lock or the part cannot be written
        where = exc.filename or root
        raise ConfigError(
            f"the data cache {str(root)!r} cannot be written ({exc.strerror}: {where}); name a writable "
            "directory with --cache or MLDIST_DATA_DIR"
        ) from None
    return done
