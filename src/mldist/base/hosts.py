"""This host's name and 64-bit keys of names, with nothing imported: every rank's start needs them, and
``socket`` and ``hashlib`` (OpenSSL's library) would cost each rank 3 ms of CPU each.

Example:
    >>> key64("nid001") == key64("nid001") != key64("nid002")
    True
"""

from __future__ import annotations

import os

#: FNV-1a's 64-bit offset and prime.
_FNV_START, _FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def key64(text: str) -> int:
    """A 64-bit key of ``text`` (FNV-1a; no ``hashlib``, whose OpenSSL costs every rank's start 3 ms). Two of
    4,096 nodes' keys collide with a chance of about 5e-13.

    Example:
        >>> key64("nid001") == key64("nid001") != key64("nid002"), f"{key64(''):x}"
        (True, 'cbf29ce484222325')
    """
    key = _FNV_START
    for byte in text.encode():
        key = ((key ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return key


def hostname() -> str:
    """This host's name, as ``socket.gethostname()`` says it (the same ``uname`` field; no ``socket``, whose
    import costs every rank's start 3 ms).

    Example:
        >>> import socket
        >>> hostname() == socket.gethostname()
        True
    """
    return os.uname().nodename
