"""Bad input: one clear line on stderr, exit code 2, never a traceback."""

from __future__ import annotations

import pytest

from conftest import mldist


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["run", "-n", "0", "--", "true"], "0 is not at least 1"),
        (["run", "-n", "two", "--", "true"], "'two' is not a whole number"),
        (["run", "-n", "2"], "missing COMMAND"),
        (["run", "-n", "2", "--"], "missing COMMAND"),
        (["run", "--bogus", "-n", "2", "true"], "unrecognized arguments: --bogus"),
        (["run", "-n", "2", "--grace", "-1", "true"], "is negative"),
        (["run", "-n", "2", "--", "/nonexistent/prog"], "cannot start '/nonexistent/prog'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "required: COMMAND"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], fragment: str) -> None:
    res = mldist(args)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, res.stderr
    assert fragment in lines[-1]
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("command", ["run", "env"])
def test_every_command_has_help_with_an_example(command: str) -> None:
    res = mldist([command, "--help"])
    assert res.returncode == 0
    assert "example:" in res.stdout
    assert f"mldist {command}" in res.stdout


def test_bad_environment_is_reported_not_raised() -> None:
    from conftest import clean_env

    res = mldist(["env", "--json", "--no-tensorflow"], env=clean_env(SLURM_STEP_ID="0", SLURM_PROCID="x"))
    assert res.returncode == 0
    assert "SLURM_PROCID='x' is not an integer" in res.stdout
