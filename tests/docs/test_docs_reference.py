"""The generated references follow the code: the CLI page the parsers, the environment page the table."""

from __future__ import annotations

import argparse
import dataclasses
import doctest
import html.parser
import importlib.util
from types import ModuleType
from typing import Any

import markdown  # Python-Markdown: what MkDocs renders the pages with
import pytest
import yaml  # PyYAML: a dependency of MkDocs

from helpers import ROOT
from mldist.base import envvalues
from mldist.base.envparse import Setting, seconds
from mldist.cli import build_parser


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mldist_docs_reference", ROOT / "docs" / "hooks" / "reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _hook()


def test_every_flag_of_every_command_is_in_the_cli_reference() -> None:
    parser, _ = build_parser()
    text = reference.cli_markdown(parser)
    flags = reference.every_flag(parser)
    assert {"mldist run", "mldist submit", "mldist data fetch", "mldist stacks"} <= set(flags)
    for command, options in flags.items():
        if command != "mldist":
            assert f"`{command}`" in text, f"no section for {command}"
        for option in options:
            assert f"`{option}" in text, f"{command} {option} is not in the reference"


def test_an_added_or_renamed_flag_changes_the_cli_reference_without_a_hand_edit() -> None:
    parser, _ = build_parser()
    before = reference.cli_markdown(parser)
    run = parser.commands["run"]
    run.add_argument("--docs-probe", metavar="N", help="a flag added after the page was written")
    restarts = next(a for a in run._actions if "--max-restarts" in a.option_strings)
    restarts.option_strings = ["--restart-limit"]  # renamed
    after = reference.cli_markdown(parser)
    assert "`--docs-probe N` | a flag added after the page was written |" in after
    assert "--docs-probe" not in before
    assert "`--restart-limit" in after and "`--max-restarts" not in after
    assert "`--max-restarts" in before


def test_the_environment_reference_has_every_variable_of_the_table_and_follows_it() -> None:
    text = reference.env_markdown(envvalues.ALL)
    assert len(envvalues.ALL) > 30
    for setting in envvalues.ALL:
        row = next((line for line in text.splitlines() if line.startswith(f"| `{setting.name}` |")), None)
        assert row, f"{setting.name} is not in the reference"
        assert setting.kind in row
    added = Setting("MLDIST_DOCS_PROBE", 5.0, seconds, "is not seconds: set it to e.g. 5", "a probe", kind="seconds")
    grown = reference.env_markdown((*envvalues.ALL, added))
    assert "| `MLDIST_DOCS_PROBE` | a probe | seconds | `5` | you |" in grown
    renamed = dataclasses.replace(envvalues.PLOT, name="MLDIST_DRAW")
    assert "`MLDIST_DRAW`" in reference.env_markdown([renamed])
    errors = reference.env_errors_markdown((added,))
    assert errors == "- `MLDIST_DOCS_PROBE='VALUE' is not seconds: set it to e.g. 5`\n\n"


def test_a_marker_is_replaced_by_its_generated_part_and_an_unknown_one_is_refused() -> None:
    page = "# Environment\n\n<!-- generated: environment -->\n\nafter\n"
    out = reference.on_page_markdown(page)
    assert "<!-- generated" not in out and "| `MLDIST_COLLECTIVE_TIMEOUT` |" in out and out.endswith("after\n")
    with pytest.raises(ValueError, match="no generated part named 'envs'"):
        reference.on_page_markdown("<!-- generated: envs -->\n")


#: Every element the generated parts may render to (a tag from a help text would be another).
RENDERED_TAGS = {"table", "thead", "tbody", "tr", "th", "td", "code", "h2", "h3", "p", "ul", "li", "div", "pre", "span"}


def _render(text: str) -> str:
    """``text`` as MkDocs renders it: Python-Markdown with the extensions of mkdocs.yml."""
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    names: list[str] = []
    configs: dict[str, Any] = {}
    for entry in config["markdown_extensions"]:
        name = next(iter(entry)) if isinstance(entry, dict) else entry
        names.append(name)
        configs[name] = entry[name] if isinstance(entry, dict) else {}
    configs["toc"] = {}  # its permalink (a "true" string here) adds nothing to this check
    return markdown.markdown(text, extensions=names, extension_configs=configs)


class _Page(html.parser.HTMLParser):
    """The tags of a rendered part and its text as a browser shows it (entities decoded)."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.text = ""
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)

    def handle_data(self, data: str) -> None:
        self.text += data


def test_html_in_help_texts_is_escaped_in_cells_headings_and_descriptions_but_not_in_code() -> None:
    parser = argparse.ArgumentParser(prog="tool", epilog="example:\n  tool go --out runs/<name> && echo done")
    sub = parser.add_subparsers()
    go = sub.add_parser("go", help="start <job> & wait", description="Start a <job>; `<kept>` & go.")
    go.add_argument("--out", metavar="<dir>", help="write to runs/<script>-<time> (`a<b>`) a|b")
    text = reference.cli_markdown(parser)
    assert "| `--out <dir>` | write to runs/&lt;script&gt;-&lt;time&gt; (`a<b>`) a\\|b |" in text
    assert "## `tool go`: start &lt;job&gt; &amp; wait\n" in text
    assert "\nStart a &lt;job&gt;; `<kept>` &amp; go.\n" in text
    assert "usage: tool go [-h] [--out <dir>]" in text  # ```text blocks are shown literally
    assert "  tool go --out runs/<name> && echo done" in text
    page = _Page(_render(text))
    assert page.tags <= RENDERED_TAGS, f"a help text became a tag: {page.tags - RENDERED_TAGS}"
    for shown in ("runs/<script>-<time>", "a<b>", "start <job> & wait", "<kept> & go", "--out <dir>", "runs/<name> &&"):
        assert shown in page.text, f"{shown!r} is not shown as it is"
    assert "&lt;" not in page.text and "&amp;" not in page.text, "escaped twice: an entity is shown"


def test_html_in_the_environment_table_is_escaped_but_not_in_its_code() -> None:
    odd = Setting("MLDIST_DOCS_PROBE", None, str, "is not <ok>: set `<x>`", "makes runs/<script> & `<y>`", kind="a <b>")
    text = reference.env_markdown([odd]) + "\n" + reference.env_errors_markdown([odd])
    assert "| `MLDIST_DOCS_PROBE` | makes runs/&lt;script&gt; &amp; `<y>` | a &lt;b&gt; | unset | you |" in text
    assert "- `` MLDIST_DOCS_PROBE='VALUE' is not <ok>: set `<x>` ``" in text
    page = _Page(_render(text))
    assert page.tags <= RENDERED_TAGS, f"a text became a tag: {page.tags - RENDERED_TAGS}"
    for shown in ("makes runs/<script> & <y>", "a <b>", "is not <ok>: set `<x>`"):
        assert shown in page.text, f"{shown!r} is not shown as it is"
    assert "&lt;" not in page.text and "&amp;" not in page.text


def test_the_examples_of_the_hook_hold() -> None:
    # The suite collects doctests of tests/ and src/ only: the hook's examples are run here.
    failed, tried = doctest.testmod(reference)
    assert tried > 5 and failed == 0
