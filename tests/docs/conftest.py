"""The built documentation site, shared by the tests of tests/docs that read it (one build per session)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import ROOT, clean_env

#: Where ``scripts/docs.sh build`` puts the site: its only folder (it refuses any other).
SITE = ROOT / "build" / "site"


def build_site() -> subprocess.CompletedProcess[str]:
    """``bash scripts/docs.sh build``, as a user runs it (strict: a warning fails it), into SITE."""
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "docs.sh"), "build"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="session")
def docs_site() -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The site built once into build/site, with the build's result (its output says where).

    Its tests share one xdist group ("docs" in tests/conftest.py), so one worker builds it.
    """
    return SITE, build_site()
