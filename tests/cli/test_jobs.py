"""``mldist submit`` options into a ``JobSpec``: site profiles, option merging, checks (no scheduler needed)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from mldist.cli import build_parser
from mldist.cli.jobs import build_spec
from mldist.errors import ConfigError


def _args(*argv: str) -> argparse.Namespace:
    return build_parser()[0].parse_args(["submit", *argv])


def test_cli_options_override_the_site_and_env_merges(tmp_path: Path) -> None:
    args = _args("--site", "polaris", "--nodes", "3", "--env", "NCCL_NET=Socket", "--env", "A=1",
                 "--output-dir", str(tmp_path), "--", "python", "t.py")  # fmt: skip
    spec = build_spec(args, ["python", "t.py"])
    env = dict(spec.env)
    assert (spec.scheduler, spec.nodes, spec.tasks, spec.gpus_per_node) == ("pbs", 3, 4, 4)
    assert env["NCCL_NET"] == "Socket" and env["A"] == "1" and env["NCCL_CROSS_NIC"] == "1"
    assert "-l filesystems=home:eagle" in spec.directives


def test_a_missing_venv_is_named(tmp_path: Path) -> None:
    args = _args("--scheduler", "slurm", "--venv", str(tmp_path / "nope"), "--", "x")
    with pytest.raises(ConfigError, match="has no bin/activate"):
        build_spec(args, ["x"])
