"""One file per node in the shared progress folder: ranks write to node-local memory, one of them for the node.

A shared file system (Lustre, GPFS) sends every open, create, rename and listing to a metadata
server the whole centre shares; 16,384 ranks renaming a record each second would be 16,384 such
operations a second, and their folder 16,384 entries. So each rank writes its record
(:class:`mldist.base.progress.Record`) into a folder of node-local memory (:func:`local_folder`:
``/dev/shm``), and about once every :data:`NODE_SECONDS` one rank of the node, whichever takes
the node's lock first (a rank whose main thread holds Python's lock cannot, another one does),
gathers the node's records into ``node-HOST.rec`` in the shared folder. Files are rewritten in
place through a descriptor kept open (:class:`Slot`): no create, no rename, no stat in steady
state; a line ``CRC JSON`` tells a whole write from one caught half way (the reader tries again).

Example:
    >>> decode(encode({"a": 1}))
    {'a': 1}
    >>> decode(b"00000000 {") is None
    True
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import hosts, processwide

#: How often a node's file in the shared folder is rewritten (seconds), whatever the job's size.
NODE_SECONDS = 1.0
#: A node's file in the shared folder: ``node-HOST.rec``.
NODE_FILE = re.compile(r"node-([A-Za-z0-9_.-]{1,200})\.rec")
#: A rank's record in the node-local folder.
RANK_FILE = re.compile(r"rank-([0-9]{1,7})\.rec")
#: How many times a reader tries a file caught half-written.
TRIES = 3


def encode(data: Any) -> bytes:
    """One line: the CRC-32 of the JSON (8 hex digits), a space, the JSON, a newline."""
    body = json.dumps(data, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def decode(raw: bytes) -> Any:
    """What :func:`encode` wrote (bytes after its newline are an older, longer write's: ignored); None when the
    line is torn or damaged."""
    line = raw.split(b"\n", 1)[0]
    crc, _, body = line.partition(b" ")
    try:
        if len(crc) != 8 or int(crc, 16) != zlib.crc32(body):
            return None
        return json.loads(body)
    except ValueError:
        return None


def read_file(path: Path) -> Any:
    """The data of a file :func:`encode` wrote, or None (missing, damaged, or torn :data:`TRIES` times)."""
    return _decoded(path.read_bytes)


def _decoded(read: Callable[[], bytes]) -> Any:
    """What ``read`` gives, decoded; read again (a writer may be mid-``pwrite``) up to :data:`TRIES` times."""
    for attempt in range(TRIES):
        try:
            data = decode(read())
        except OSError:
            return None
        if data is not None:
            return data
        time.sleep(0.01 * (attempt + 1))
    return None


class Slot:
    """A file rewritten in place through a descriptor kept open: one ``pwrite`` a time in steady state.

    A shorter write leaves the end of a longer one behind; :func:`decode` reads up to the first newline.

    Args:
        path: the file (its folder made, owner-only, if missing).
        truncate: truncate it at this process's first write (a file of its own).
        keep: keep the descriptor open between writes (False: open, write, close each time).
        held: hold a shared ``flock`` on it while the descriptor is open (a rank's node-local record: the
            kernel lets go when the process dies, even of SIGKILL, so the node's last rank knows it left).
    """

    def __init__(self, path: Path, keep: bool = True, truncate: bool = True, held: bool = False) -> None:
        self.path, self.keep, self.held = path, keep, held
        self._fd: int | None = None
        self._fresh = truncate  # a file others write too is never truncated: a reader would find it empty

    def put(self, data: bytes) -> None:
        """Write ``data`` at the start of the file."""
        fd = self._fd if self._fd is not None else self._open()
        try:
            os.pwrite(fd, data, 0)
        finally:
            if not self.keep:
                self.close()

    def _open(self) -> int:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if self._fresh else 0) | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o600)
        except FileNotFoundError:  # the folder is missing: made once, not tried before every write
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, flags, 0o600)
        if self.held:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        self._fd, self._fresh = fd, False
        return fd

    def close(self) -> None:
        """Close the descriptor (the file stays)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def local_root() -> Path:
    """Node-local memory for this user: ``/dev/shm/mldist-UID``, else the temporary directory's."""
    base = Path("/dev/shm") if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    if base is None:
        import tempfile  # a rare path: tempfile brings shutil, random and the compressors to every rank

        base = Path(tempfile.gettempdir())
    return base / f"mldist-{os.getuid()}"


def local_folder(shared: Path, root: Path | None = None) -> Path:
    """The node-local folder of the job whose shared progress folder is ``shared``.

    Example:
        >>> local_folder(Path("/runs/a/progress"), Path("/m")) != local_folder(Path("/runs/b/progress"), Path("/m"))
        True
    """
    return (local_root() if root is None else root) / f"progress-{hosts.key64(str(shared.absolute())):016x}"


def node_name(host: str) -> str:
    """``node-HOST.rec`` (characters outside ``[A-Za-z0-9_.-]`` become ``_``).

    Example:
        >>> node_name("nid001234"), node_name("a b")
        ('node-nid001234.rec', 'node-a_b.rec')
    """
    return f"node-{re.sub(r'[^A-Za-z0-9_.-]', '_', host)[:200]}.rec"


class Node:
    """This node's side of the shared folder, for the ranks of this process (one in a real job).

    Args:
        shared: the shared progress folder.
        local: the node-local folder (:func:`local_folder`).
        host: this node's name.
        keep: keep descriptors open (see :class:`Slot`).
        defer: a record published when the node's file is not due goes in when it is (a timer thread), even if
            its rank publishes nothing more.
    """

    def __init__(self, shared: Path, local: Path, host: str, keep: bool = True, defer: bool = True) -> None:
        self.shared, self.local, self.host, self.keep, self.defer = shared, local, host, keep, defer
        self._timer: threading.Timer | None = None
        self._peers: dict[str, tuple[int, int]] = {}  # the node's records: name -> (inode, descriptor)
        self.keep_peers = keep  # keep descriptors to the node's records (the benchmark's 4,096 nodes: no)
        self._timers, self._closed = 0, False  # closed: at exit (forget, _at_exit), no timer starts
        self.file = Slot(shared / node_name(host), keep=keep, truncate=False)
        self._slots: dict[int, Slot] = {}
        self._lock: int | None = None
        #: Node-file writes and records gathered by this process (the benchmark counts them).
        self.writes = self.gathered = 0

    def publish(self, rank: int, record: dict[str, Any], now: float) -> None:
        """Write ``rank``'s record to node-local memory, then the node's file when it is due."""
        slot = self._slots.get(rank) or self._slots.setdefault(
            rank, Slot(self.local / f"rank-{rank}.rec", self.keep, held=self.keep)
        )
        slot.put(encode(record))
        wait = self.flush(now, rank)
        if wait > 0 and self.defer and self._timer is None and not self._closed:  # goes in when it is due
            if not self._timers:
                # or at this process's exit, whichever comes first
                processwide.at_exit("atexit: the node file's last record", self._at_exit)
            self._timers += 1
            self._timer = threading.Timer(wait, self._deferred)
            self._timer.daemon = True
            self._timer.start()

    def _deferred(self) -> None:
        self._timer = None
        with contextlib.suppress(OSError):
            self.flush(time.time())

    def _at_exit(self) -> None:
        """A record that waits for its timer goes in now (this process's last word); no timer starts after it.

        A thread started as the interpreter ends runs on its torn-down state: the stall watch's thread
        publishing at that moment killed a rank with SIGSEGV in ``_PyThreadState_SetCurrent`` (Python 3.11).
        """
        self._closed = True
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            with contextlib.suppress(OSError):
                self.flush(time.time(), force=True)

    def flush(self, now: float, rank: int | None = None, force: bool = False) -> float:
        """Rewrite the node's file from node-local memory if it is due (or lacks ``rank``, or ``force``); seconds
        until it is due (0: written now, or another rank of the node is at it)."""
        lock = self._lock_fd()
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if force else fcntl.LOCK_NB))
        except OSError:
            return 0.0  # another rank of the node is at it
        try:
            stamp = decode(os.pread(lock, 4096, 0)) or {}
            wait = _due(stamp, now, rank, force)
            if wait > 0:
                return wait
            records = self.gather()
            self.file.put(encode({"host": self.host, "written": now, "ranks": records}))
            self.writes += 1
            os.pwrite(lock, encode({"written": now, "ranks": [r.get("rank") for r in records], "pid": os.getpid()}), 0)
            return 0.0
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

    def _lock_fd(self) -> int:
        if self._lock is None:
            self.local.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._lock = os.open(self.local / "node.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._lock

    def gather(self) -> list[dict[str, Any]]:
        """Every record in the node-local folder (node-local reads: no shared file system), each read through a
        descriptor kept open while its file is there (records are rewritten in place): one ``pread`` a record."""
        found: list[dict[str, Any]] = []
        seen: dict[str, tuple[int, int]] = {}
        with contextlib.suppress(OSError), os.scandir(self.local) as entries:
            for entry in entries:
                if RANK_FILE.fullmatch(entry.name):
                    seen[entry.name] = (entry.inode(), 0)
        for name in [n for n, (ino, _) in self._peers.items() if seen.get(n, (None, 0))[0] != ino]:
            with contextlib.suppress(OSError):
                os.close(self._peers.pop(name)[1])  # gone, or a new file of that name
        for name, (ino, _) in seen.items():
            if name not in self._peers and self.keep_peers:
                with contextlib.suppress(OSError):
                    self._peers[name] = (ino, os.open(self.local / name, os.O_RDONLY | os.O_CLOEXEC))
            data = self._read_peer(name)
            if isinstance(data, dict):
                found.append(data)
        self.gathered += len(found)
        return sorted(found, key=lambda r: int(r.get("rank", 0)))

    def _read_peer(self, name: str) -> Any:
        if name not in self._peers:
            return read_file(self.local / name)
        fd = self._peers[name][1]
        return _decoded(lambda: os.pread(fd, 1 << 16, 0))

    def forget(self, rank: int, shared_too: bool = False) -> None:
        """Remove ``rank``'s node-local record at its exit; the last rank of the node removes the folder (and,
        with ``shared_too``, the node's file: a temporary folder's, worth nothing after the job). Records of
        ranks that died without a word (SIGKILL, :func:`abandoned`) do not keep the folder. No timer starts
        after it (see :meth:`_at_exit`)."""
        self._closed = True
        slot = self._slots.pop(rank, None)
        if slot is not None:
            slot.close()
        with contextlib.suppress(OSError):
            (self.local / f"rank-{rank}.rec").unlink()
        with contextlib.suppress(OSError):
            left = [name for name in os.listdir(self.local) if RANK_FILE.fullmatch(name)]
            if any(not (self.keep and abandoned(self.local / name)) for name in left):
                return  # other ranks of the node are still there
            for name in os.listdir(self.local):
                (self.local / name).unlink()
            self.local.rmdir()
            if shared_too:
                self.file.close()
                self.file.path.unlink()

    def close(self) -> None:
        """Close every descriptor this process keeps."""
        for slot in (self.file, *self._slots.values()):
            slot.close()
        if self._lock is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock)
            self._lock = None
        for _, fd in self._peers.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._peers.clear()


def abandoned(path: Path) -> bool:
    """Whether the rank record ``path`` was left by a process that is gone (killed: it could not remove it).

    Its rank holds a shared lock while it runs (:class:`Slot`'s ``held``), and its pid is in the record: gone
    when no process holds the lock and no process has that pid. A file still empty (just made) is not.

    Example:
        >>> abandoned(Path("/nonexistent/rank-0.rec"))
        True
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True  # removed already
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        data = decode(os.pread(fd, 1 << 16, 0))
        pid = data.get("pid") if isinstance(data, dict) else None
        if not isinstance(pid, int) or pid < 1:
            return False
        os.kill(pid, 0)
        return False  # alive (or its pid taken again: the folder stays, as before)
    except ProcessLookupError:
        return True
    except OSError:  # its rank holds the lock, or another user's process has the pid
        return False
    finally:
        os.close(fd)


def remove_local(shared: Path, root: Path | None = None) -> None:
    """Remove the node-local folder of the job whose shared progress folder is ``shared`` (the launcher, at the
    end of a run: a killed rank's record would stay in ``/dev/shm`` until the node reboots).

    Example:
        >>> remove_local(Path("/nonexistent/progress"), Path("/nonexistent"))
    """
    local = local_folder(shared, root)
    with contextlib.suppress(OSError):
        for entry in os.scandir(local):
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
        local.rmdir()


def _due(stamp: dict[str, Any], now: float, rank: int | None, force: bool) -> float:
    """Seconds until this process writes the node's file (0: now). The process that wrote it last keeps
    writing it once every :data:`NODE_SECONDS` (its descriptors to the node's records stay useful); another
    takes over when it is :data:`NODE_SECONDS` late (its main thread holds Python's lock, or it is gone), or
    when a rank is missing from the file.

    Example:
        >>> mine, theirs = {"written": 10.0, "ranks": [0], "pid": os.getpid()}, {"written": 10.0, "ranks": [0]}
        >>> _due(mine, 11.0, 0, False), _due(theirs, 11.0, 0, False), _due(theirs, 12.0, 0, False)
        (0.0, 1.0, 0.0)
    """
    last, ranks = float(stamp.get("written", 0.0)), stamp.get("ranks", [])
    if force or now < last or (rank is not None and rank not in ranks):
        return 0.0
    after = NODE_SECONDS if stamp.get("pid") == os.getpid() else 2 * NODE_SECONDS
    return max(0.0, last + after - now)


def read_nodes(shared: Path, names: list[str]) -> list[dict[str, Any]]:
    """The records in the node files ``names`` of ``shared`` (see :func:`node_name`), damaged ones skipped."""
    out: list[dict[str, Any]] = []
    for name in names:
        data = read_file(shared / name)
        if isinstance(data, dict) and isinstance(data.get("ranks"), list):
            out.extend(r for r in data["ranks"] if isinstance(r, dict))
    return out
