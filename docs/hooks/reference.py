"""The generated parts of the documentation site: a MkDocs hook (``hooks:`` in mkdocs.yml).

A page asks for a generated part with a marker line of its own, e.g. ``<!-- generated: cli -->``;
at build time the marker is replaced by the text made from the code, so the reference cannot drift
from it and no generated file is committed:

- ``cli``: every command, subcommand and flag, from ``mldist.cli.build_parser()``;
- ``environment``: every ``MLDIST_*`` variable, from the table ``mldist.base.envvalues.ALL``;
- ``environment-errors``: the line each of those variables gives for a value it refuses.

The functions take the parser or the table as arguments, so a test can hand them a changed one.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tool")
    >>> _ = parser.add_argument("--speed", type=int, default=3, help="how fast (default %(default)s)")
    >>> "`--speed SPEED`" in cli_markdown(parser, level=3)
    True
"""

from __future__ import annotations

import argparse
import html
import re
from collections.abc import Iterable, Iterator
from typing import Any

#: ``<!-- generated: NAME -->`` on a line of its own.
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)
#: Who sets a variable, in the words of the reference page (``envparse``'s USER, LAUNCHER, BATCH, WORKER).
SETTERS = {
    "user": "you",
    "launcher": "`mldist run`",
    "batch script": "the job script of `mldist submit`",
    "worker": "the worker",
}


#: An inline code span: a run of backticks, its text, the same run again (CommonMark's rule).
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")


def _text(text: str) -> str:
    """Plain text for Markdown: ``&``, ``<`` and ``>`` escaped outside code spans.

    Markdown passes raw HTML through, so a help's ``runs/<script>-<time>`` became an unknown tag
    that hid the rest of the page in a browser. Code spans are left as they are: Markdown escapes
    their text itself (escaping it here would show ``&lt;``).

    Example:
        >>> _text("runs/<script>-<time> & `<x>`")
        'runs/&lt;script&gt;-&lt;time&gt; &amp; `<x>`'
    """
    out, done = [], 0
    for span in CODE_SPAN.finditer(text):
        out += [html.escape(text[done : span.start()], quote=False), span.group()]
        done = span.end()
    return "".join(out) + html.escape(text[done:], quote=False)


def _cell(text: str) -> str:
    r"""Text for one cell of a Markdown table (or a heading): one line, HTML and pipes escaped.

    Example:
        >>> print(_cell("two\n lines | <x>"))
        two lines \| &lt;x&gt;
    """
    return _text(" ".join(text.split())).replace("|", "\\|")


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = ""
    if action.nargs != 0:
        if action.metavar is not None:
            metavar = f" {action.metavar}" if isinstance(action.metavar, str) else " " + " ".join(action.metavar)
        elif action.choices is not None:
            metavar = " {" + ",".join(str(c) for c in action.choices) + "}"
        else:
            metavar = f" {action.dest.upper()}"
    return ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    formatter = parser._get_formatter()  # argparse's own expansion of %(default)s, %(choices)s, ...
    return _cell(formatter._expand_help(action))


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, sub, helps.get(name, "")


def cli_markdown(parser: argparse.ArgumentParser, level: int = 2, path: str = "") -> str:
    """The reference of ``parser`` and its subcommands, at any depth, as Markdown.

    Args:
        parser: a parser, e.g. the first item of ``mldist.cli.build_parser()``.
        level: the heading level of the subcommands (its own has none).
        path: the words before the subcommands' names (default the parser's ``prog``).

    Example:
        >>> p = argparse.ArgumentParser(prog="tool")
        >>> sub = p.add_subparsers().add_parser("go", help="start")
        >>> _ = sub.add_argument("-n", "--count", help="how many")
        >>> print(cli_markdown(p).split("## ")[1].splitlines()[0])
        `tool go`: start
    """
    path = path or parser.prog
    lines = [f"```text\n{parser.format_usage().strip()}\n```", ""]
    rows = [a for a in parser._actions if not isinstance(a, argparse._SubParsersAction)]
    rows = [a for a in rows if a.help != argparse.SUPPRESS]
    if rows:
        lines += ["| argument | what it does |", "| --- | --- |"]
        lines += [f"| {_flags(action)} | {_help(parser, action)} |" for action in rows]
        lines.append("")
    if parser.epilog:
        lines += ["```text", parser.epilog.strip("\n"), "```", ""]
    for name, sub, helped in _subparsers(parser):
        title = f"`{path} {name}`" + (f": {_cell(helped)}" if helped else "")
        lines += [f"{'#' * level} {title}", ""]
        if sub.description:
            lines += [_text(sub.description.strip()), ""]
        lines.append(cli_markdown(sub, level + 1, f"{path} {name}"))
    return "\n".join(lines)


def every_flag(parser: argparse.ArgumentParser, path: str = "") -> dict[str, set[str]]:
    """Each command's words (``"mldist data fetch"``) and the option strings it takes.

    Example:
        >>> p = argparse.ArgumentParser(prog="tool")
        >>> _ = p.add_subparsers().add_parser("go").add_argument("--far")
        >>> sorted(every_flag(p)["tool go"])
        ['--far', '--help', '-h']
    """
    path = path or parser.prog
    found = {path: {flag for action in parser._actions for flag in action.option_strings}}
    for name, sub, _ in _subparsers(parser):
        found.update(every_flag(sub, f"{path} {name}"))
    return found


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`"


def env_markdown(settings: Iterable[Any]) -> str:
    """The table of environment variables: name, what it does, what it takes, default, who sets it.

    Args:
        settings: ``mldist.base.envparse.Setting`` records (``mldist.base.envvalues.ALL``).

    Example:
        >>> from mldist.base.envvalues import PLOT
        >>> env_markdown([PLOT]).splitlines()[2].startswith("| `MLDIST_PLOT` |")
        True
    """
    lines = ["| variable | what it does | takes | default | set by |", "| --- | --- | --- | --- | --- |"]
    for s in settings:
        setters = ", ".join(SETTERS.get(who) or _cell(who) for who in s.by)
        lines.append(f"| `{s.name}` | {_cell(s.doc)} | {_cell(s.kind)} | {_default(s.default)} | {setters} |")
    return "\n".join(lines) + "\n"


def env_errors_markdown(settings: Iterable[Any]) -> str:
    """The one line each variable gives for a value it refuses (``NAME='VALUE' ...``), as a list.

    Example:
        >>> from mldist.base.envvalues import PORT_BASE
        >>> env_errors_markdown([PORT_BASE]).startswith("- `MLDIST_PORT_BASE='VALUE' is not a port")
        True
    """
    return "".join(f"- {_code(f'{s.name}={chr(39)}VALUE{chr(39)} {s.says}')}\n" for s in settings if s.says) + "\n"


def _code(text: str) -> str:
    """``text`` as inline code, with a longer fence when it holds backticks itself."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def generated(name: str) -> str:
    """The text of the generated part ``name`` (what replaces its marker)."""
    if name == "cli":
        from mldist.cli import build_parser

        return cli_markdown(build_parser()[0])
    from mldist.base import envvalues

    if name == "environment":
        return env_markdown(envvalues.ALL)
    if name == "environment-errors":
        return env_errors_markdown(envvalues.ALL)
    raise ValueError(f"no generated part named {name!r}: use cli, environment or environment-errors")


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: replace each marker line with its generated part."""
    return MARKER.sub(lambda found: generated(found.group(1)), markdown)
