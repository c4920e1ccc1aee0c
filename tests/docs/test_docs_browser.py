"""A headless Chromium (Debian's package) opens the built site from the local server: it renders.

The index page and the hang guide must show their title and the navigation, and reference the
search index, which the server must serve non-empty. The screenshots stay in SHOTS for a person
to look at.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import ROOT, check, clean_env

SHOTS = Path("/tmp/mldist-docs-shots")
#: Each page: its path below the site and its title as the browser shows it.
PAGES = {"index": ("", "mldist"), "hangs": ("guides/hangs/", "When a job hangs, fails or is slow - mldist")}
#: Material's search: the worker script named in the page's configuration, which loads search/search_index.json.
SEARCH = re.compile(r'"search": "((?:\.\./)*assets/javascripts/workers/search\.[0-9a-f]+\.min\.js)"')


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's chromium, installed by scripts/docs.sh when it is missing."""
    res = subprocess.run(
        ["bash", str(ROOT / "scripts/docs.sh"), "chromium"], capture_output=True, text=True, timeout=900
    )
    return check(res).stdout.strip().splitlines()[-1]


@pytest.fixture
def served(docs_site: tuple[Path, subprocess.CompletedProcess[str]]) -> Iterator[str]:
    """The built site served by ``scripts/docs.sh serve``: its URL."""
    site, built = docs_site
    check(built)
    server = subprocess.Popen(
        ["bash", str(ROOT / "scripts/docs.sh"), "serve", str(site)], stdout=subprocess.PIPE, text=True, env=clean_env()
    )
    try:
        assert server.stdout
        url = server.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def _chromium(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    # --no-sandbox: the suite runs as root, where Chromium's sandbox refuses to start.
    argv = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--user-data-dir=/tmp/mldist-docs-chromium",
        *args,
    ]
    return check(subprocess.run(argv, capture_output=True, text=True, timeout=120))


@pytest.mark.parametrize("name", list(PAGES))
def test_the_page_renders_with_title_navigation_and_search(name: str, served: str, chromium: str) -> None:
    path, title = PAGES[name]
    url = served + path
    dom = _chromium(chromium, "--dump-dom", url).stdout
    assert f"<title>{title}</title>" in dom, dom[:2000]
    assert 'class="md-nav md-nav--primary"' in dom, "no navigation"
    nav = " ".join(dom[dom.index('class="md-nav md-nav--primary"') :].split())
    for entry in ("Start", "Guides", "Reference", "Concepts", "Site recipes", "Command line", "When a job hangs"):
        assert f"> {entry}" in nav, f"the navigation lacks {entry!r}"
    assert 'class="md-search__input"' in dom, "no search box"
    worker = SEARCH.search(dom)
    assert worker, "the page names no search worker"
    with urllib.request.urlopen(urllib.parse.urljoin(url, worker.group(1)), timeout=30) as answer:
        assert len(answer.read()) > 1000
    with urllib.request.urlopen(served + "search/search_index.json", timeout=30) as answer:
        index = json.load(answer)
    assert len(index["docs"]) > 50, "the search index is empty"
    SHOTS.mkdir(exist_ok=True)
    shot = SHOTS / f"{name}.png"
    shot.unlink(missing_ok=True)
    _chromium(chromium, f"--screenshot={shot}", "--window-size=1280,900", url)
    assert shot.stat().st_size > 20_000, "the screenshot is (nearly) blank"
