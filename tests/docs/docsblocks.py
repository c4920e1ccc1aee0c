"""The fenced blocks of the documentation pages, their markers, and the check of their ``mldist`` commands.

A marker is an HTML comment on the line just before a block (docs/contributing/index.md):
``<!-- not-runnable: REASON -->``, ``<!-- dry-run -->`` or ``<!-- file: NAME -->``. A ``python``,
``bash`` or ``sh`` block without one is run by tests/docs/test_docs_blocks.py.

Example:
    >>> [(b.lang, b.marker) for b in blocks_of("<!-- dry-run -->\\n```bash\\nmldist submit -- x\\n```\\n", "p.md")]
    [('bash', 'dry-run')]
    >>> problems_of_command(["mldist", "run", "--no-such-flag", "--", "python", "t.py"])[0][:40]
    'mldist run: unrecognized arguments: --no'
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

from helpers import ROOT

DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md"))
#: The languages whose blocks run (or say why not).
RUNNABLE = ("python", "bash", "sh")
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_MARKER = re.compile(r"^\s*<!-- (.*?) -->\s*$")
#: argparse's messages for a command the parsers do not take: a renamed flag or command, a bad choice.
_REFUSED = re.compile(r"unrecognized arguments|ambiguous option|invalid choice|not allowed with")
#: A command word: ``mldist run:`` (a line mldist prints) and ``mldist run>`` are prose, not commands.
_COMMAND = re.compile(r"[a-z][a-z-]*")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block: its page, first line number, language, text and marker (``""`` for none)."""

    page: str
    line: int
    lang: str
    code: str
    marker: str

    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(text: str, page: str) -> list[Block]:
    """The fenced blocks of a page's Markdown ``text``."""
    lines = text.split("\n")
    found, i = [], 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, lang = opened.groups()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        marker = _MARKER.match(lines[i - 1]) if i else None
        code = "\n".join(line[len(indent) :] for line in lines[i + 1 : end])
        found.append(Block(page, i + 1, lang, code + "\n", marker.group(1) if marker else ""))
        i = end + 1
    return found


def page_blocks(path: Path) -> list[Block]:
    return blocks_of(path.read_text(), path.relative_to(DOCS).as_posix())


def commands(code: str) -> Iterator[list[str]]:
    """The words of each ``mldist ...`` command in shell ``code`` (after ``srun ...``, up to ``|``, ``&&``, ``#``)."""
    logical = code.replace("\\\n", " ")
    for line in logical.split("\n"):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        start = next((i for i, w in enumerate(words) if w == "mldist"), None)
        if start is None:
            continue
        rest = words[start:]
        if len(rest) < 2 or not _COMMAND.fullmatch(rest[1]):
            continue
        stop = next((i for i, w in enumerate(rest) if w in ("|", "||", "&&", ";", ">", "2>&1")), len(rest))
        yield rest[:stop]


def inline_commands(text: str) -> Iterator[list[str]]:
    """The words of each inline code span of prose that is an ``mldist COMMAND ...`` command."""
    outside = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.MULTILINE | re.DOTALL)
    for span in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", outside):
        if re.match(r"mldist [a-z]", span) and "..." not in span:
            with contextlib.suppress(ValueError):
                words = shlex.split(span)
                if _COMMAND.fullmatch(words[1]):
                    yield words


def problems_of_command(words: list[str]) -> list[str]:
    """What the real parsers refuse in ``mldist ...`` ``words`` (a renamed flag, a command that is gone).

    A value a placeholder stands for (``-n N``, ``JOB``) is not a problem: only what names options or
    commands is checked.
    """
    from mldist.cli import build_parser

    parser, _ = build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args, unknown = parser.parse_known_args(words[1:])
    except SystemExit:
        message = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ""
        return [message] if _REFUSED.search(message) else []
    if unknown:
        return [f"mldist {args.command}: unrecognized arguments: {' '.join(unknown)}"]
    return []
