"""The generated references follow the code: the CLI page the parsers, the environment page the table."""

from __future__ import annotations

import dataclasses
import importlib.util
from types import ModuleType

import pytest

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
