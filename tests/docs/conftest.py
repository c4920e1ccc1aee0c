"""The built documentation site, shared by the tests of tests/docs that read it (one build per session)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import ROOT, clean_env


def build_site(site: Path) -> subprocess.CompletedProcess[str]:
    """``bash scripts/docs.sh build SITE``, as a user runs it (strict: a warning fails it)."""
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "docs.sh"), "build", str(site)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="session")
def docs_site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The site built once into a temporary folder, with the build's result (its output says where)."""
    site = tmp_path_factory.mktemp("docs") / "site"
    return site, build_site(site)
