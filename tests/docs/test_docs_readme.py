"""The short README: at most 200 lines, links that lead to pages, examples that are the site's, and a map
(docs/contributing/readme-map.md) that says where each section of the former long README is now."""

from __future__ import annotations

import re
from pathlib import Path

from docsblocks import DOCS, RUNNABLE, blocks_of, commands, inline_commands, page_blocks, problems_of_command
from markdown.extensions.toc import slugify  # MkDocs' own anchors (its toc extension)

from helpers import ROOT

README = ROOT / "README.md"
MAP = DOCS / "contributing" / "readme-map.md"
#: The sections of the long README before issue 52 (``git show c305857:README.md | grep '^#'``, less the two
#: shell comments inside a block). Frozen on purpose: the map must keep a row for each of them.
OLD_SECTIONS = (
    "# mldist",
    "## The two commands",
    "## Using it",
    "### Training with Keras 3",
    "### Keras 3 on JAX",
    "### Scripts written for Keras's, TensorFlow's or JAX's own API",
    "### Collective engines",
    "### When a job hangs",
    "### Horovod scripts",
    "### TensorFlow Probability",
    "### Datasets offline",
    "### Checkpoints, resume and preemption",
    "### Elastic training: lose a host, keep training",
    "### Batch jobs",
    "### Run directory and TensorBoard",
    "### Timelines, pre-flight checks, readable output",
    "### What `mldist run` guarantees",
    "### Launchers detected",
    "### Environment variables",
    "## Benchmarks",
    "## Security",
    "## Layout",
)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """The anchors MkDocs gives the headings of ``page`` (outside fenced blocks)."""
    outside = re.sub(r"^\s*```.*?^\s*```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    titles = re.findall(r"^#{1,6} (.+?)\s*$", outside, flags=re.MULTILINE)
    return {slugify(title.replace("`", ""), "-") for title in titles}


def _problems_of_links(text: str, base: Path) -> list[str]:
    """Each relative link of ``text`` (Markdown at ``base``) that leads to no file, or to no heading of its page."""
    bad = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:: not this repository's
        path, _, anchor = target.partition("#")
        page = (base.parent / path).resolve() if path else base
        if not page.exists():
            bad.append(f"{target}: no such file")
        elif anchor and anchor not in _anchors(page):
            bad.append(f"{target}: no heading with that anchor on {page.name}")
    return bad


def test_the_readme_is_short_and_every_link_of_it_leads_to_a_page_of_the_site() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200, f"README.md has {len(text.splitlines())} lines: move text to docs/"
    assert not _problems_of_links(text, README), _problems_of_links(text, README)
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in _LINK.findall(text)}
    for page in ("index.md", "start/install.md", "start/first-run.md", "contributing/readme-map.md"):
        assert (DOCS / page).resolve() in linked, f"the README does not link to docs/{page}"
    for command in (
        "bash scripts/setup.sh",
        "bash scripts/test.sh",
        "bash scripts/docs.sh",
        "bash scripts/docs.sh serve",
    ):
        assert f"\n{command} " in text, f"the README does not show `{command}`"


def test_every_example_of_the_readme_is_one_the_site_runs_or_marks_and_its_commands_parse() -> None:
    site = [b for page in sorted(DOCS.rglob("*.md")) for b in page_blocks(page)]
    examples = [b for b in blocks_of(README.read_text(), "README.md") if b.lang in RUNNABLE]
    assert len(examples) >= 3, examples  # the two commands, one example, the docs build
    for block in examples:
        # On a page, the block runs in tests/docs/test_docs_blocks.py or its marker says why not.
        assert any(b.lang == block.lang and b.code == block.code for b in site), (
            f"{block.where()}: this block is on no page of the site; copy it there so the suite runs it"
        )
    found = [words for b in examples for words in commands(b.code)] + list(inline_commands(README.read_text()))
    assert len(found) >= 5, found
    bad = [f"{' '.join(words)}: {p}" for words in found for p in problems_of_command(words)]
    assert not bad, bad


def test_the_map_gives_every_old_readme_section_a_page_that_exists() -> None:
    text = MAP.read_text()
    rows = [line for line in text.splitlines() if re.match(r"\| `", line)]
    sections: dict[str, list[str]] = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        heading = re.match(r"(`+) ?(#{1,3} .+?) ?\1", cells[0])
        assert heading, f"a row of the map names no old section: {row}"
        targets = _LINK.findall(cells[1])
        assert targets, f"the row of {heading.group(2)!r} names no page"
        sections.setdefault(heading.group(2), []).extend(targets)
    assert set(sections) == set(OLD_SECTIONS), f"missing or unknown: {set(sections) ^ set(OLD_SECTIONS)}"
    assert not _problems_of_links(text, MAP), _problems_of_links(text, MAP)
    for targets in sections.values():
        for target in targets:
            page = (MAP.parent / target.partition("#")[0]).resolve()
            assert page.suffix == ".md" and page.is_relative_to(DOCS.resolve()), target
            assert len(page.read_text().split()) > 30, f"{target}: a page with hardly any text"


def test_the_link_check_refuses_a_missing_page_and_a_missing_heading(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    page.write_text("# A page\n\n## What `mldist run` guarantees\n\n```bash\n# not a heading\n```\n")
    assert _anchors(page) == {"a-page", "what-mldist-run-guarantees"}
    ok = "[x](a.md) [y](a.md#what-mldist-run-guarantees) [z](#a-page) [w](https://example.org/x)"
    assert _problems_of_links(ok, page) == []
    bad = _problems_of_links("[x](b.md) [y](a.md#not-a-heading) [z](a.md#not-a-heading)", page)
    assert len(bad) == 3 and "no such file" in bad[0] and "no heading" in bad[1], bad
