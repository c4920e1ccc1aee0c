"""The site builds strictly (warnings and broken links are errors) through scripts/docs.sh."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml  # PyYAML: a dependency of MkDocs
from docsblocks import DOCS

from helpers import PY, ROOT, clean_env, tail


def _nav_pages(nav: list[object]) -> list[str]:
    found: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        found += _nav_pages(value) if isinstance(value, list) else [str(value)]
    return found


def test_the_site_builds_strictly_and_says_where_its_index_is(
    docs_site: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    site, res = docs_site
    assert res.returncode == 0, tail(res)
    assert res.stdout.strip().splitlines()[-1] == str(site / "index.html")
    nav = _nav_pages(yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)["nav"])
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert set(nav) == pages, f"in the navigation but not in docs/, or the other way: {set(nav) ^ pages}"
    for page in nav:
        stem = page[: -len(".md")]
        html = site / (stem[: -len("index")] if stem.endswith("index") else stem + "/") / "index.html"
        assert html.is_file(), html
        assert "<!-- generated" not in html.read_text(), f"{page}: a marker was left unreplaced"
    cli = (site / "reference/cli/index.html").read_text()
    assert "--max-restarts" in cli and "mldist data fetch" in cli
    api = (site / "reference/api/index.html").read_text()
    assert 'id="mldist.init"' in api and 'id="mldist.keras.DistributedOptimizer"' in api
    env = (site / "reference/environment/index.html").read_text()
    assert "MLDIST_COLLECTIVE_TIMEOUT" in env


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    config = re.sub(r"(?m)^docs_dir: .*$", f"docs_dir: {docs}", (ROOT / "mkdocs.yml").read_text())
    config = config.replace("  - docs/hooks/reference.py", f"  - {DOCS / 'hooks' / 'reference.py'}")
    config = config.replace("paths: [src]", f"paths: [{ROOT / 'src'}]")
    (tmp_path / "mkdocs.yml").write_text(config)
    with (docs / "start" / "install.md").open("a") as page:
        page.write("\nSee [the missing page](../guides/no-such-page.md).\n")
    argv = [PY, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml"), "-d", str(tmp_path / "site")]
    res = subprocess.run(
        argv, cwd=tmp_path, env=clean_env(NO_MKDOCS_2_WARNING="1"), capture_output=True, text=True, timeout=300
    )
    assert res.returncode != 0, tail(res)
    assert "no-such-page.md" in res.stderr, tail(res)
