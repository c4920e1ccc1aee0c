"""Every python, bash and sh block of the site runs here, or its marker says why not; every ``mldist``
command on the site, in a block or inline, is one the parsers take (a renamed flag fails here)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from docsblocks import DOCS, PAGES, RUNNABLE, Block, commands, inline_commands, page_blocks, problems_of_command

from helpers import PY, check, clean_env

BIN = Path(PY).parent
#: Pages with a block the suite runs (a file block counts: a runnable block of the page uses it).
RUN_PAGES = [
    p for p in PAGES if any(b.lang in RUNNABLE and not b.marker.startswith("not-runnable") for b in page_blocks(p))
]


def _env(home: Path) -> dict[str, str]:
    # A fresh HOME: no sites.toml, data cache or Keras config of the user's reaches the blocks.
    return clean_env(HOME=str(home), PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")


def _run(block: Block, cwd: Path, index: int) -> None:
    env = _env(cwd)
    if block.marker.startswith("file:"):
        (cwd / block.marker.split(":", 1)[1].strip()).write_text(block.code)
    elif block.marker == "dry-run":
        for words in commands(block.code):
            assert words[:2] in (["mldist", "submit"], ["mldist", "build-env"]), (
                f"{block.where()}: a dry-run block holds only mldist submit and build-env lines, not {words[:2]}"
            )
            argv = [str(BIN / "mldist"), words[1], "--dry-run", *words[2:]]
            res = check(subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60))
            assert res.stdout.startswith("#!/bin/bash"), f"{block.where()}: {shlex.join(words)} gave no job script"
    elif block.lang in RUNNABLE and not block.marker:
        script = cwd / f"block-{index}.{'py' if block.lang == 'python' else 'sh'}"
        script.write_text(block.code)
        argv = [PY, str(script)] if block.lang == "python" else ["bash", "-euo", "pipefail", str(script)]
        res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
        assert res.returncode == 0, (
            f"{block.where()} failed (exit {res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
        )


@pytest.mark.parametrize("page", RUN_PAGES, ids=[p.relative_to(DOCS).as_posix() for p in RUN_PAGES])
def test_the_runnable_blocks_of_each_page_run(page: Path, tmp_path: Path) -> None:
    for index, block in enumerate(page_blocks(page)):
        _run(block, tmp_path, index)


def test_every_block_is_run_or_says_why_not() -> None:
    bad = []
    for page in PAGES:
        for block in page_blocks(page):
            kind, _, arg = block.marker.partition(":")
            if block.marker and kind not in ("not-runnable", "dry-run", "file"):
                bad.append(f"{block.where()}: unknown marker <!-- {block.marker} -->")
            elif kind in ("not-runnable", "file") and not arg.strip():
                bad.append(f"{block.where()}: <!-- {kind}: ... --> needs {'a reason' if kind != 'file' else 'a name'}")
            elif kind == "dry-run" and block.lang not in ("bash", "sh"):
                bad.append(f"{block.where()}: a dry-run block is bash")
            elif not block.marker and block.lang not in (*RUNNABLE, "text", "toml", "yaml", "json"):
                bad.append(f"{block.where()}: a ```{block.lang or '(no language)'} block: name a language")
    assert not bad, "\n".join(bad)
    assert len(RUN_PAGES) >= 5, RUN_PAGES  # the suite runs blocks of the Start pages, the recipes, ...


def test_every_mldist_command_on_the_site_parses() -> None:
    checked, bad = 0, []
    for page in PAGES:
        text = page.read_text()
        found = [words for b in page_blocks(page) if b.lang in ("bash", "sh") for words in commands(b.code)]
        for words in [*found, *inline_commands(text)]:
            checked += 1
            bad += [f"{page.relative_to(DOCS)}: {shlex.join(words)}: {p}" for p in problems_of_command(words)]
    assert not bad, "\n".join(bad)
    assert checked > 100, checked  # the scan finds the commands (the site shows a few hundred)


@pytest.mark.parametrize(
    ("line", "refused"),
    [
        ("mldist run --max-restart-count 3 -- python train.py", True),  # a renamed flag
        ("mldist sumbit --nodes 2 -- python train.py", True),  # a command that does not exist
        ("mldist run --communication tcp -- python train.py", True),  # a choice that does not exist
        ("srun -n 8 mldist bench --model resnet50 --batch-size 32", False),
        ("mldist logs JOB --rank 1 --follow  # placeholders are values", False),
        ("mldist submit --wrap 'nsys profile -o {job_dir}/r{rank}' -- python train.py --epochs 5", False),
    ],
)
def test_the_command_check_refuses_what_the_parsers_refuse(line: str, refused: bool) -> None:
    found = [p for words in commands(line) for p in problems_of_command(words)]
    assert bool(found) == refused, found
