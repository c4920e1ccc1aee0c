"""benchmarks/network.py refuses bad flags in one line, before it starts the test hosts or shapes a link.

The benchmark itself needs root, the test hosts and an hour (``sudo python benchmarks/network.py``): it
is never run here. What is tested is that a typo costs a second, not a round of every run.
"""

from __future__ import annotations

import subprocess

import pytest

from helpers import PY, ROOT, clean_env, tail

NETWORK = str(ROOT / "benchmarks" / "network.py")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--compression", "bf17"], "--compression 'bf17' is not a compression; use fp16 or bf16"),
        (["--compression", ""], "--compression '' is not a compression"),
        (["--compression", "none"], "--compression 'none' is not a compression"),
        (["--rate", "3furlongs"], "'3furlongs' is not a rate"),
        (["--backends", "torch"], "--backends 'torch'"),
        (["--models", "resnet"], "'resnet' is not a model"),
        (["--rounds", "0"], "--rounds 0: give 1 or more"),
    ],
)
def test_a_bad_flag_is_one_line_before_any_host_starts(args: list[str], message: str) -> None:
    res = subprocess.run(
        [PY, NETWORK, "--horovod", "none", *args], capture_output=True, text=True, env=clean_env(), timeout=60
    )
    assert res.returncode == 2, tail(res)
    (line,) = res.stderr.splitlines()
    assert res.stdout == "" and line.startswith("network.py: error: ") and message in line, tail(res)
