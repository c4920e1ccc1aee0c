"""A headless Chromium (Debian's package) opens the built site from the local server: it renders.

The index page and the hang guide must show their title and the navigation, and reference the
search index, which the server must serve non-empty; the command-line reference must show the
section of every command (a help text's ``<script>`` once swallowed all that followed it). The
screenshots stay in SHOTS for a person to look at.
"""

from __future__ import annotations

import html.parser
import importlib.util
import json
import re
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml  # PyYAML: a dependency of MkDocs

from helpers import ROOT, check, clean_env
from mldist.cli import build_parser

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


#: What may hold a section's heading in Material's page (article.md-content__inner and its frame).
FRAME = {"html", "body", "div", "main", "article"}
#: Elements without an end tag, which the parser must not keep open.
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def _commands() -> list[str]:
    """Every command's words below ``mldist`` (``"mldist data fetch"``), from docs/hooks/reference.py."""
    spec = importlib.util.spec_from_file_location("mldist_docs_reference", ROOT / "docs" / "hooks" / "reference.py")
    assert spec and spec.loader
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    return [command for command in reference.every_flag(build_parser()[0]) if command != "mldist"]


def _nav_pages(nav: list[object]) -> dict[str, str]:
    """Each page of a navigation of mkdocs.yml: its title -> its file below docs/."""
    found: dict[str, str] = {}
    for entry in nav:
        for title, value in entry.items() if isinstance(entry, dict) else ():
            found.update(_nav_pages(value) if isinstance(value, list) else {title: str(value)})
    return found


def _page_path(title: str) -> str:
    """The path below the site of the page ``title`` of mkdocs.yml's navigation (``reference/cli/``)."""
    nav = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)["nav"]
    page = _nav_pages(nav)[title].removesuffix(".md")
    return page.removesuffix("index") if page.endswith("index") else page + "/"


class _Headings(html.parser.HTMLParser):
    """Each heading's text (``mldist run: start ...``) and the elements around it, from a DOM dump,
    and the elements inside the page's article.

    The parser keeps a script's text as text, as the browser did: a heading it swallowed is not one.
    """

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.open: list[str] = []
        self.found: list[tuple[str, list[str]]] = []  # (text, the tags around it)
        self.in_article: set[str] = set()
        self.feed(dom)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in {"h2", "h3", "h4", "h5"}:
            self.found.append(("", list(self.open)))
        if "article" in self.open:
            self.in_article.add(tag)
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.open:
            del self.open[len(self.open) - 1 - self.open[::-1].index(tag) :]

    def handle_data(self, data: str) -> None:
        if self.found and any(tag in {"h2", "h3", "h4", "h5"} for tag in self.open):
            text, around = self.found[-1]
            self.found[-1] = (text + data, around)


def test_the_cli_reference_shows_every_command_section_and_the_help_texts_angle_brackets(
    served: str, chromium: str
) -> None:
    url = served + _page_path("Command line")
    dom = _chromium(chromium, "--dump-dom", url).stdout
    page = _Headings(dom)
    headings = page.found
    commands = _commands()
    assert {"mldist run", "mldist bench", "mldist data fetch"} <= set(commands)
    for command in commands:
        around = next((around for text, around in headings if text.split(":")[0].strip(" ¶") == command), None)
        assert around is not None, f"the section of {command} is not shown (swallowed by an element before it?)"
        assert set(around) <= FRAME, f"the heading of {command} is inside {around}"
    # A help's <script> or <time> would be an element of the article, holding what followed it.
    assert not page.in_article & {"script", "time"}, f"the article holds {page.in_article & {'script', 'time'}}"
    assert "runs/&lt;script&gt;-&lt;time&gt;" in dom and "runs/bench-&lt;time&gt;" in dom
    SHOTS.mkdir(exist_ok=True)
    shot = SHOTS / "cli.png"
    shot.unlink(missing_ok=True)
    # Tall: the --run-dir row of `mldist run` (where the page once went blank) and sections after it.
    _chromium(chromium, f"--screenshot={shot}", "--window-size=1280,4000", url)
    assert shot.stat().st_size > 20_000, "the screenshot is (nearly) blank"
