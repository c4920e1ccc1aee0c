"""Fixtures of the dataset tests: a loopback HTTP mirror and an environment that reaches it directly."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest
from fakedata import Mirror, mirror_handler

from helpers import clean_env


@pytest.fixture
def mirror() -> Iterator[Mirror]:
    """A running loopback mirror; add files to ``mirror.files``."""
    state = Mirror()
    server = ThreadingHTTPServer(("127.0.0.1", 0), mirror_handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/keras-datasets/"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def direct_env() -> dict[str, str]:
    """The clean test environment without proxies, so the loopback mirror is reached directly."""
    env = clean_env(no_proxy="127.0.0.1,localhost", NO_PROXY="127.0.0.1,localhost")
    for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        env.pop(key, None)
    return env
