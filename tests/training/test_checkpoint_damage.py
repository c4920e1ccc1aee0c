"""Damaged and hostile checkpoints are skipped, never fatal and never dangerous.

Each test saves a good checkpoint at step 1 and one at step 2 with CheckpointManager (real files, real
numpy), damages step 2 in one way, and restores in-process under a timeout: restore must return step 1
with its values, after one one-line warning naming step 2. Nothing may raise, hang (FIFOs, devices),
follow a symbolic link or allocate what a header announces.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import threading
import tracemalloc
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mldist.checkpoint import CheckpointManager
from mldist.checkpoint.format import MANIFEST, STATE, read_checkpoint
from mldist.errors import CheckpointError

# Other tests ran TF ops in this process before the in-process mldist.init().
pytestmark = pytest.mark.filterwarnings("ignore:mldist.init.. came after")

GOOD, BAD = 1, 2
TIMEOUT = 20.0  # seconds; a blocking open of a FIFO would hang forever


def _variables() -> tuple[Any, Any]:
    import tensorflow as tf

    return tf.Variable(tf.zeros([3, 2])), tf.Variable(0, dtype=tf.int64)


@pytest.fixture
def bad(tmp_path: Path) -> Path:
    """``ckpt-2`` (sound, for the test to damage) after a good ``ckpt-1`` in ``tmp_path/ckpt``."""
    weights, counter = _variables()
    mgr = CheckpointManager(tmp_path / "ckpt", keep=5)
    for step in (GOOD, BAD):
        weights.assign(np.full((3, 2), step, np.float32))
        counter.assign(step)
        mgr.save(step, extra={"epoch": step}, model=[weights], counter=counter)
    return tmp_path / "ckpt" / f"ckpt-{BAD:010d}"


def _restore_skipping(bad: Path, check_extra: Callable[[dict[str, Any]], str | None] | None = None) -> str:
    """Restore (failing after TIMEOUT instead of hanging); assert step GOOD and its values; the warning."""
    weights, counter = _variables()
    mgr = CheckpointManager(bad.parent, check_extra=check_extra)
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["step"] = mgr.restore(model=[weights], counter=counter)
        except BaseException as exc:  # reported below, in the test's thread
            result["error"] = exc

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        thread = threading.Thread(target=run, daemon=True)  # daemon: a hung one does not block the exit
        thread.start()
        thread.join(TIMEOUT)
    assert not thread.is_alive(), f"restore still blocked after {TIMEOUT} s on {bad}"
    assert "error" not in result, f"restore raised {result['error']!r}"
    assert result["step"] == GOOD and mgr.restored_extra == {"epoch": GOOD}
    assert weights.numpy().tolist() == [[1.0, 1.0]] * 3 and int(counter.numpy()) == GOOD
    texts = [str(w.message) for w in caught if "mldist: skipping" in str(w.message)]
    assert len(texts) == 1 and str(bad) in texts[0] and "\n" not in texts[0], texts
    return texts[0]


def _manifest(bad: Path) -> dict[str, Any]:
    return dict(json.loads((bad / MANIFEST).read_text()))


def _replace_state(bad: Path, state: bytes, **changes: Any) -> None:
    """A hostile writer: new ``state.npz`` and manifest ``changes``, with a matching size and checksum."""
    manifest = _manifest(bad) | changes
    manifest["files"] = {STATE: {"bytes": len(state), "sha256": hashlib.sha256(state).hexdigest()}}
    (bad / STATE).write_bytes(state)
    (bad / MANIFEST).write_text(json.dumps(manifest))


def _npz(**arrays: Any) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


COUNTER = np.array(BAD, np.int64)

MANIFEST_DAMAGE: dict[str, Callable[[dict[str, Any]], Any]] = {
    "step-as-string": lambda m: m | {"step": "2"},
    "step-of-another-directory": lambda m: m | {"step": 7},
    "format-as-string": lambda m: m | {"format": "1"},
    "bytes-as-string": lambda m: m | {"files": {STATE: m["files"][STATE] | {"bytes": "300"}}},
    "files-as-list": lambda m: m | {"files": [STATE]},
    "objects-spec-without-dtype": lambda m: m | {"objects": {**m["objects"], "model": [[[3, 2]]]}},
    "objects-shape-as-string": lambda m: m | {"objects": {**m["objects"], "model": [["3x2", "float32"]]}},
    "objects-as-list": lambda m: m | {"objects": [["model", [3, 2]]]},
    "objects-unknown-dtype": lambda m: m | {"objects": {**m["objects"], "model": [[[3, 2], "object"]]}},
    "extra-as-list": lambda m: m | {"extra": [1]},
    "manifest-is-a-list": lambda m: [m],
}


@pytest.mark.parametrize("damage", list(MANIFEST_DAMAGE))
def test_manifest_with_wrong_types_is_skipped(damage: str, bad: Path) -> None:
    (bad / MANIFEST).write_text(json.dumps(MANIFEST_DAMAGE[damage](_manifest(bad))))
    assert f"skipping damaged checkpoint: {bad / MANIFEST}" in _restore_skipping(bad)


def test_extra_that_keras_cannot_use_is_skipped(bad: Path) -> None:
    from mldist.keras.checkpoint import _extra_problem

    (bad / MANIFEST).write_text(json.dumps(_manifest(bad) | {"extra": {"epoch": "2"}}))
    assert "extra.epoch is '2'" in _restore_skipping(bad, check_extra=_extra_problem)


def test_missing_array_is_skipped(bad: Path) -> None:
    _replace_state(bad, _npz(**{"model.0": np.full((3, 2), BAD, np.float32)}))
    assert "has no array 'counter.0'" in _restore_skipping(bad)


# "manifest": the manifest still describes the model, the array differs (damage or a hostile writer);
# "both": manifest and array agree with each other but not with the model (another model's checkpoint).
@pytest.mark.parametrize("lie", ["manifest", "both"])
def test_array_of_another_shape_is_skipped(lie: str, bad: Path) -> None:
    objects = {"objects": {"model": [[[4, 2], "float32"]], "counter": [[[], "int64"]]}} if lie == "both" else {}
    _replace_state(bad, _npz(**{"model.0": np.full((4, 2), BAD, np.float32), "counter.0": COUNTER}), **objects)
    text = _restore_skipping(bad)
    assert ("other variables for 'model'" if lie == "both" else "as float32 (4, 2), its manifest says") in text


@pytest.mark.parametrize("lie", ["manifest", "both"])
def test_array_of_another_dtype_is_skipped(lie: str, bad: Path) -> None:
    objects = {"objects": {"model": [[[3, 2], "float64"]], "counter": [[[], "int64"]]}} if lie == "both" else {}
    _replace_state(bad, _npz(**{"model.0": np.full((3, 2), BAD, np.float64), "counter.0": COUNTER}), **objects)
    text = _restore_skipping(bad)
    assert ("other variables for 'model'" if lie == "both" else "as float64 (3, 2), its manifest says") in text


def _petabyte_npz() -> bytes:
    """An npz whose ``model.0`` header announces 2**48 x 4 float32 (4 PiB) followed by 24 bytes."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (281474976710656, 4), }"
    header += " " * (-(10 + len(header) + 1) % 64) + "\n"  # npy pads the header to a multiple of 64
    npy = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode("latin1") + bytes(24)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("model.0.npy", npy)
        archive.writestr("counter.0.npy", _npz_member(COUNTER))
    return buf.getvalue()


def _npz_member(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def test_npy_header_announcing_petabytes_is_refused_without_allocating(bad: Path) -> None:
    state = _petabyte_npz()
    _replace_state(bad, state)
    assert "header announces 4503599627370496 bytes of float32, not 24" in _restore_skipping(bad)
    # With no shapes in the manifest only the header-against-size check stands in the way.
    _replace_state(bad, state, objects={})
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="announces 4503599627370496 bytes"):
            read_checkpoint(bad)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"reading allocated {peak} bytes"


@pytest.mark.parametrize("link", [STATE, MANIFEST, "checkpoint directory"])
def test_symlink_to_a_valid_file_elsewhere_is_refused(link: str, bad: Path, tmp_path: Path) -> None:
    # The target is the sound file itself: only the never-follow rule can refuse it.
    source = bad if link == "checkpoint directory" else bad / link
    target = tmp_path / "elsewhere" / source.name
    target.parent.mkdir()
    shutil.move(source, target)
    source.symlink_to(target)
    assert "a symbolic link, never followed" in _restore_skipping(bad)


@pytest.mark.parametrize("name", [STATE, MANIFEST])
def test_fifo_is_refused_without_blocking(name: str, bad: Path) -> None:
    (bad / name).unlink()
    os.mkfifo(bad / name)  # no writer ever opens it: a plain open() for reading would block forever
    assert f"{bad / name} is a FIFO; refused" in _restore_skipping(bad)


@pytest.mark.parametrize("kind", ["device", "symlink to /dev/zero", "directory"])
def test_device_or_other_non_regular_state_is_refused(kind: str, bad: Path) -> None:
    (bad / STATE).unlink()
    if kind == "device":
        try:  # a character device like /dev/zero (1, 5): endless zeros if it were read
            os.mknod(bad / STATE, stat.S_IFCHR | 0o600, os.makedev(1, 5))
            expected = "is a device; refused"
        except PermissionError:  # no CAP_MKNOD: the symlink case covers "never follow", the FIFO and
            (bad / STATE).symlink_to("/dev/zero")  # directory cases the regular-file check
            expected = "a symbolic link, never followed"
    elif kind == "directory":
        (bad / STATE).mkdir()
        expected = "is a directory; refused"
    else:
        (bad / STATE).symlink_to("/dev/zero")
        expected = "a symbolic link, never followed"
    assert expected in _restore_skipping(bad)


def test_when_no_checkpoint_is_usable_restore_starts_afresh_with_a_warning(bad: Path) -> None:
    good = bad.with_name(f"ckpt-{GOOD:010d}")
    for path in (good, bad):
        (path / STATE).unlink()
        os.mkfifo(path / STATE)
    weights, counter = _variables()
    with pytest.warns(UserWarning) as caught:
        assert CheckpointManager(bad.parent).restore(model=[weights], counter=counter) == 0
    texts = [str(w.message) for w in caught]
    assert [t for t in texts if "skipping damaged" in t] == [
        f"mldist: skipping damaged checkpoint: {p / STATE} is a FIFO; refused" for p in (bad, good)
    ]
    assert f"mldist: no usable checkpoint in {bad.parent}; starting from step 0" in texts
    assert weights.numpy().tolist() == [[0.0, 0.0]] * 3
