"""``scripts/docs.sh build`` builds only into build/site: any other folder is refused, nothing deleted.

A build empties its folder first, so ``build docs`` once deleted the documentation sources. The
script runs here from a copy in a temporary tree, with a bootstrap.sh that only leaves a mark: a
regression deletes the copy's sentinels, never the real sources, and the tests need no site build.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT, clean_env, tail

#: The stand-in for scripts/bootstrap.sh: the mark says the build went past its check; exit 3 stops it there.
BOOTSTRAP = '#!/usr/bin/env bash\ntouch "$(dirname "$0")/../bootstrapped"\nexit 3\n'
#: Targets that are not build/site, as a user might type them (relative ones are to the repository root).
REFUSED = ["docs", "src", ".", "build", "build/site/..", "build/site/sub", "../tree/docs", "OUTSIDE"]
#: Spellings of build/site itself ("" is the default, as with no DIR).
ACCEPTED = ["", "build/site", "./build/site/", "ROOT/build/site"]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A throwaway repository root: scripts/docs.sh copied, the stand-in bootstrap, sentinel files."""
    root = tmp_path / "tree"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "docs.sh", root / "scripts" / "docs.sh")
    (root / "scripts" / "bootstrap.sh").write_text(BOOTSTRAP)
    for folder in ("docs", "src", "build", "outside"):
        (root / folder).mkdir()
        (root / folder / "sentinel").write_text("keep me\n")
    return root


def _build(tree: Path, target: str) -> subprocess.CompletedProcess[str]:
    target = target.replace("ROOT", str(tree)).replace("OUTSIDE", str(tree / "outside"))
    argv = ["bash", str(tree / "scripts" / "docs.sh"), "build", target]
    return subprocess.run(argv, cwd=tree, env=clean_env(), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("target", REFUSED)
def test_a_build_into_another_folder_is_refused_in_one_line_and_deletes_nothing(tree: Path, target: str) -> None:
    res = _build(tree, target)
    assert res.returncode == 2, tail(res)
    shown = target.replace("ROOT", str(tree)).replace("OUTSIDE", str(tree / "outside"))
    assert res.stderr == (
        f"docs: builds only into build/site; refusing '{shown}' (the site is always build/site; copy it from there)\n"
    )
    assert res.stdout == ""
    assert not (tree / "bootstrapped").exists(), "refused only after bootstrap started"
    for folder in ("docs", "src", "build", "outside"):
        assert (tree / folder / "sentinel").read_text() == "keep me\n", f"{folder}/ was touched"


@pytest.mark.parametrize("target", ACCEPTED)
def test_build_site_itself_however_spelled_is_taken(tree: Path, target: str) -> None:
    res = _build(tree, target)
    assert res.returncode == 3, tail(res)  # the stand-in bootstrap's: the build went past its check
    assert (tree / "bootstrapped").exists()
    assert "refusing" not in res.stderr
