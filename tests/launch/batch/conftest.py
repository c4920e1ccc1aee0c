"""Fixtures for the batch-script tests; the stand-in harness itself is harness.py."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from harness import PROGRAMS, STANDIN


@pytest.fixture(scope="session")
def standin_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of ``NAME`` wrappers that run the stand-in with this Python (no exec bit needed in git)."""
    bindir = tmp_path_factory.mktemp("standin-bin")
    for name in PROGRAMS:
        wrapper = bindir / name
        argv = " ".join(shlex.quote(a) for a in (sys.executable, "-I", "-S", str(STANDIN), name))
        wrapper.write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        wrapper.chmod(0o755)
    return bindir
