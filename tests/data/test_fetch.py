"""``mldist data fetch`` and ``mldist data list`` as a user runs them, against a loopback mirror.

The mirror serves generated MNIST-shaped files (``--mirror`` points at it, ``--sha256`` pins
their checksums): nothing is downloaded from the internet.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakedata import Mirror, mnist_npz, sha256

from helpers import check, mldist

NPZ = mnist_npz(n_train=2000, n_test=100)  # ~1.5 MB: big enough to be cut in the middle


def fetch(cache: Path, mirror: Mirror, *extra: str) -> list[str]:
    """The argument list of a fetch of mnist from ``mirror`` into ``cache``."""
    return ["data", "fetch", "mnist", "--cache", str(cache), "--mirror", mirror.url, *extra]


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_fetch_checks_renames_and_list_shows_it(tmp_path: Path, mirror: Mirror, direct_env: dict[str, str]) -> None:
    mirror.files["mnist.npz"] = NPZ
    res = check(mldist(fetch(tmp_path, mirror, "--sha256", sha256(NPZ)), env=direct_env, timeout=30))
    final = tmp_path / "mnist" / "mnist.npz"
    assert final.read_bytes() == NPZ
    assert not list(tmp_path.rglob("*.part"))
    assert "mnist.npz: downloaded, sha256 ok" in res.stdout
    assert "mnist.npz 100%" in res.stderr  # the progress bar (a line per quarter when not a terminal)
    assert mirror.requests == [("/keras-datasets/mnist.npz", None)]

    again = check(mldist(fetch(tmp_path, mirror, "--sha256", sha256(NPZ)), env=direct_env, timeout=30))
    assert "already in the cache" in again.stdout
    assert len(mirror.requests) == 1  # nothing downloaded twice

    listed = check(mldist(["data", "list", "--cache", str(tmp_path)], env=direct_env, timeout=30)).stdout
    row = next(line.split() for line in listed.splitlines() if line.startswith("mnist "))
    assert row[:3] == ["mnist", "1/1", f"{len(NPZ) / 1e6:.1f}"]
    assert " ".join(row[4:]) == "verified (pinned)"  # checked, against our --sha256 rather than the table's
    assert any(line.split()[:3] == ["cifar10", "0/1", "-"] for line in listed.splitlines())
    data = json.loads(check(mldist(["data", "list", "--cache", str(tmp_path), "--verify", "--json"])).stdout)
    assert data["datasets"][0] | {"folder": ""} == {
        "name": "mnist",
        "folder": "",
        "present": 1,
        "total": 1,
        "size": len(NPZ),
        "status": "pinned",
    }


def test_a_cut_download_leaves_no_file_and_the_next_fetch_resumes_it(
    tmp_path: Path, mirror: Mirror, direct_env: dict[str, str]
) -> None:
    mirror.files["mnist.npz"] = NPZ
    mirror.cut_next = 1
    args = fetch(tmp_path, mirror, "--sha256", sha256(NPZ), "--retries", "0", "-q")
    res = check(mldist(args, env=direct_env, timeout=30), 2)
    assert one_line(res.stderr).endswith(
        "kept in {}: run the same command again to resume".format(tmp_path / "mnist" / "mnist.npz.part")
    )
    part = tmp_path / "mnist" / "mnist.npz.part"
    assert not (tmp_path / "mnist" / "mnist.npz").exists()
    kept = part.stat().st_size
    assert 0 < kept < len(NPZ)
    listed = check(mldist(["data", "list", "--cache", str(tmp_path)], env=direct_env, timeout=30)).stdout
    assert "partial" in next(line for line in listed.splitlines() if line.startswith("mnist "))

    check(mldist(args, env=direct_env, timeout=30))
    assert mirror.requests[-1] == ("/keras-datasets/mnist.npz", f"bytes={kept}-")  # only the rest
    assert (tmp_path / "mnist" / "mnist.npz").read_bytes() == NPZ
    assert not part.exists()


def test_a_break_is_retried_from_where_it_stopped(tmp_path: Path, mirror: Mirror, direct_env: dict[str, str]) -> None:
    mirror.files["mnist.npz"] = NPZ
    mirror.cut_next = 1
    res = check(mldist(fetch(tmp_path, mirror, "--sha256", sha256(NPZ)), env=direct_env, timeout=30))
    assert "retrying in 1 s" in res.stderr
    assert [r[1] is not None for r in mirror.requests] == [False, True]
    assert (tmp_path / "mnist" / "mnist.npz").read_bytes() == NPZ


def test_a_wrong_checksum_fails_in_one_line_and_leaves_nothing(
    tmp_path: Path, mirror: Mirror, direct_env: dict[str, str]
) -> None:
    mirror.files["mnist.npz"] = NPZ
    wrong = "0" * 64
    res = check(mldist(fetch(tmp_path, mirror, "--sha256", wrong, "-q"), env=direct_env, timeout=30), 2)
    line = one_line(res.stderr)
    assert line.startswith("mldist data: error: mnist.npz from ")
    assert f"has sha256 {sha256(NPZ)}, expected {wrong}; deleted it" in line
    assert [p.name for p in (tmp_path / "mnist").iterdir() if p.name != ".lock"] == []


def test_the_built_in_checksum_rejects_other_bytes(tmp_path: Path, mirror: Mirror, direct_env: dict[str, str]) -> None:
    mirror.files["mnist.npz"] = NPZ  # not Keras's mnist.npz: the table's SHA-256 must refuse it
    res = check(mldist(fetch(tmp_path, mirror, "-q"), env=direct_env, timeout=30), 2)
    assert "expected 731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1" in one_line(res.stderr)
    assert not (tmp_path / "mnist" / "mnist.npz").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--sha256", "xyz"], "'xyz' is not a SHA-256 (64 hexadecimal digits)"),
        (["--sha256", "x.gz=" + "a" * 64], "mnist has no file 'x.gz'; its files: mnist.npz"),
        (["--mirror", "ftp://example.org/"], "is neither an http(s):// or file:// URL nor a directory"),
    ],
)
def test_bad_flags_fail_in_one_line(tmp_path: Path, extra: list[str], message: str) -> None:
    res = check(mldist(["data", "fetch", "mnist", "--cache", str(tmp_path), *extra], timeout=30), 2)
    assert message in one_line(res.stderr)
    assert not (tmp_path / "mnist" / "mnist.npz").exists()


def test_unknown_dataset_and_a_missing_file_fail_in_one_line(
    tmp_path: Path, mirror: Mirror, direct_env: dict[str, str]
) -> None:
    res = check(mldist(["data", "fetch", "imagenet", "--cache", str(tmp_path)], timeout=30), 2)
    assert "unknown dataset 'imagenet'; known: mnist, fashion_mnist, cifar10" in one_line(res.stderr)
    res = check(mldist(fetch(tmp_path, mirror, "-q"), env=direct_env, timeout=30), 2)
    assert "mnist.npz: HTTP 404" in one_line(res.stderr)


def test_a_directory_mirror_and_a_multi_file_dataset(tmp_path: Path, direct_env: dict[str, str]) -> None:
    from fakedata import fashion_files, write

    files = fashion_files()
    write(tmp_path / "site", files)
    pins = [a for name, data in files.items() for a in ("--sha256", f"{name}={sha256(data)}")]
    args = ["data", "fetch", "fashion-mnist", "--cache", str(tmp_path / "cache"), "--mirror", str(tmp_path / "site")]
    check(mldist([*args, *pins], env=direct_env, timeout=30))
    for name, data in files.items():
        assert (tmp_path / "cache" / "fashion_mnist" / name).read_bytes() == data
    res = check(mldist([*args, "--sha256", "a" * 64], env=direct_env, timeout=30), 2)
    assert "fashion_mnist has 4 files: pin each as --sha256 FILE=HASH" in one_line(res.stderr)
