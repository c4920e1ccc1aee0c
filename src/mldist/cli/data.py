"""Datasets for offline compute nodes: ``mldist data fetch`` and ``mldist data list``.

Example:
    $ mldist data fetch mnist
    $ mldist data list
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from .common import Handler, Parser, add_command, count, seconds

DATA_EXAMPLE = """\
example:
  mldist data fetch mnist      # on a login node (internet access): into ~/.cache/mldist/data
  mldist data list             # what the cache holds, checked or not
then in the job (no internet needed):
  (x_train, y_train), (x_test, y_test) = mldist.data.load("mnist")

Datasets: mnist, fashion_mnist, cifar10. The cache is --cache DIR, else
MLDIST_DATA_DIR, else ~/.cache/mldist/data."""

FETCH_EXAMPLE = """\
example:
  mldist data fetch mnist
  mldist data fetch cifar10 --cache /scratch/$USER/data   # jobs: export MLDIST_DATA_DIR=/scratch/$USER/data
  mldist data fetch mnist --mirror https://mirror.example.org/keras-datasets/
  mldist data fetch mnist --mirror /shared/datasets --sha256 HASH
  mldist data fetch fashion_mnist --sha256 t10k-labels-idx1-ubyte.gz=HASH

Run again after an interruption: the download resumes where it stopped (FILE.part).
A file gets its final name only after its SHA-256 matched; a wrong one is deleted."""

LIST_EXAMPLE = """\
example:
  mldist data list
  mldist data list --verify          # hash every file again
  mldist data list --cache /scratch/$USER/data --json

STATUS: verified; verified (pinned): checked against your --sha256;
unverified: changed since its check, or copied in by hand; damaged: --verify
found another checksum; partial: run fetch again to resume; incomplete; absent."""


def _add_cache(parser: Any) -> None:
    parser.add_argument(
        "--cache", metavar="DIR", help="the data cache (default: $MLDIST_DATA_DIR, else ~/.cache/mldist/data)"
    )


def register(sub: Any) -> dict[str, Handler]:
    """Add ``data`` (with its actions ``fetch`` and ``list``) to the subcommands; its handler by name."""
    data = add_command(sub, "data", "fetch datasets for offline compute nodes; list the cache", DATA_EXAMPLE)
    actions = data.add_subparsers(dest="data_command", metavar="ACTION", parser_class=Parser)
    actions.required = True
    fetch = add_command(actions, "fetch", "download a dataset into the cache, resumable and checksummed", FETCH_EXAMPLE)
    fetch.add_argument("name", metavar="NAME", help="mnist, fashion_mnist or cifar10")
    _add_cache(fetch)
    fetch.add_argument("--mirror", metavar="URL", help="a URL or directory with the files, instead of the default site")
    fetch.add_argument(
        "--sha256",
        action="append",
        default=[],
        metavar="HASH",
        help="expected SHA-256 instead of the built-in one: HASH, or FILE=HASH for each file (repeatable)",
    )
    fetch.add_argument(
        "--retries", type=count(0, 100), default=2, metavar="N", help="resumed attempts after a break (default 2)"
    )
    fetch.add_argument(
        "--timeout", type=seconds, default=60.0, metavar="SECONDS", help="seconds without data before giving up (60)"
    )
    fetch.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    listing = add_command(actions, "list", "show what the cache holds: files, size, checked or not", LIST_EXAMPLE)
    _add_cache(listing)
    listing.add_argument("--verify", action="store_true", help="hash every file again instead of trusting the record")
    listing.add_argument("--json", action="store_true", help="print JSON")
    return {"data": _cmd_data}


def _cmd_data(args: argparse.Namespace) -> int:
    return _cmd_fetch(args) if args.data_command == "fetch" else _cmd_list(args)


def _cache_root(args: argparse.Namespace) -> Path:
    """The cache of ``--cache``, else ``MLDIST_DATA_DIR``, else the default, once it can be one."""
    from ..data.datasets.table import usable_cache_dir

    return usable_cache_dir(args.cache, "--cache")


def _cmd_fetch(args: argparse.Namespace) -> int:
    from ..data.datasets import ENV_CACHE, cache_dir, dataset, fetch
    from ..data.datasets.fetch import megabytes

    ds = dataset(args.name)
    root = _cache_root(args)
    stream = None if args.quiet else sys.stderr
    done = fetch(
        ds.name, root, mirror=args.mirror, sha256=args.sha256, retries=args.retries, timeout=args.timeout, stream=stream
    )
    for path, fresh in done:
        print(f"{path.name}: {'downloaded, sha256 ok' if fresh else 'already in the cache, sha256 ok'}")
    size = sum(path.stat().st_size for path, _ in done)
    hint = f" (jobs: export {ENV_CACHE}={root})" if root != cache_dir() else ""
    where = f"{len(done)} file(s), {megabytes(size)} in {root / ds.name}"
    print(f"{ds.name}: {where}; load with mldist.data.load({ds.name!r}){hint}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from ..data.datasets import cached
    from ..data.datasets.fetch import megabytes

    root = _cache_root(args)
    rows = cached(root, verify=args.verify)
    if args.json:
        print(json.dumps({"cache": str(root), "datasets": [dataclasses.asdict(r) for r in rows]}, indent=2))
        return 0
    print(f"{'NAME':<15}{'FILES':<7}{'SIZE':>10}  STATUS")
    for row in rows:
        size = megabytes(row.size) if row.present else "-"
        shown = "verified (pinned)" if row.status == "pinned" else row.status
        print(f"{row.name:<15}{f'{row.present}/{row.total}':<7}{size:>10}  {shown}")
    print(f"cache: {root}")
    return 0
