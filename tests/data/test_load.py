"""``mldist.data.load``: reads only the cache, returns what ``keras.datasets`` returns, or says how to fetch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fakedata import cifar_tar, fashion_files, mnist_arrays, mnist_npz, write

import mldist.data
from mldist.data.datasets import DATASETS, cache_dir, load
from mldist.errors import ConfigError


def test_a_missing_dataset_names_the_exact_fetch_command(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        mldist.data.load("mnist", cache=tmp_path / "my cache")
    message = str(caught.value)
    assert "\n" not in message
    assert f"mnist is not in the data cache {tmp_path / 'my cache'} (no mnist.npz)" in message
    assert f"run `mldist data fetch mnist --cache '{tmp_path / 'my cache'}'`" in message


def test_a_file_as_the_cache_is_named_not_taken_for_an_empty_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It said "mnist is not in the data cache /etc/passwd ... run fetch", and fetch then failed."""
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ConfigError, match=r"^cache '.*a-file' is a file, not a directory: name a directory$"):
        load("mnist", cache=tmp_path / "a-file")
    monkeypatch.setenv("MLDIST_DATA_DIR", str(tmp_path / "a-file" / "below"))
    with pytest.raises(ConfigError, match=r"^MLDIST_DATA_DIR .*a-file is a file, so no directory can be made below it"):
        load("mnist")


def test_the_cache_comes_from_mldist_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLDIST_DATA_DIR", str(tmp_path))
    assert cache_dir() == tmp_path
    with pytest.raises(ConfigError, match=f"run `mldist data fetch cifar10 --cache {tmp_path}`"):
        load("cifar10")
    monkeypatch.delenv("MLDIST_DATA_DIR")
    assert cache_dir() == Path.home() / ".cache" / "mldist" / "data"


def test_mnist_has_keras_shapes_and_dtypes(tmp_path: Path) -> None:
    write(tmp_path / "mnist", {"mnist.npz": mnist_npz(64, 16)})
    (x_train, y_train), (x_test, y_test) = mldist.data.load("mnist", cache=tmp_path)
    assert (x_train.shape, y_train.shape, x_test.shape, y_test.shape) == ((64, 28, 28), (64,), (16, 28, 28), (16,))
    assert {a.dtype for a in (x_train, y_train, x_test, y_test)} == {np.dtype(np.uint8)}
    np.testing.assert_array_equal(y_test, mnist_arrays(64, 16)["y_test"])


def test_fashion_mnist_reads_the_idx_files(tmp_path: Path) -> None:
    write(tmp_path / "fashion_mnist", fashion_files(32, 8))
    (x_train, y_train), (x_test, y_test) = load("fashion_mnist", cache=tmp_path)
    assert (x_train.shape, y_train.shape, x_test.shape, y_test.shape) == ((32, 28, 28), (32,), (8, 28, 28), (8,))
    assert x_train.dtype == y_train.dtype == np.uint8
    np.testing.assert_array_equal(x_train, mnist_arrays(32, 8, seed=1)["x_train"])


def test_cifar10_is_channels_last_with_column_labels(tmp_path: Path) -> None:
    write(tmp_path / "cifar10", {"cifar-10-python.tar.gz": cifar_tar(per_batch=4)})
    (x_train, y_train), (x_test, y_test) = load("cifar10", cache=tmp_path)
    assert (x_train.shape, y_train.shape, x_test.shape, y_test.shape) == (
        (20, 32, 32, 3),
        (20, 1),
        (4, 32, 32, 3),
        (4, 1),
    )
    assert x_train.dtype == y_train.dtype == np.uint8
    assert x_train[:, :, :, 1:].max() == 0  # only the red plane was set: channels are last
    assert x_train[5:8, :, :, 0].min() == x_train[5:8, :, :, 0].max() == 1  # batch 2 in order
    assert y_train[:, 0].tolist() == [i for i in range(5) for _ in range(4)]
    assert y_test[:, 0].tolist() == [5] * 4


def test_a_pickle_with_other_globals_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "cifar10", {"cifar-10-python.tar.gz": cifar_tar(per_batch=1, evil=True)})
    with pytest.raises(ConfigError, match=r"cifar10 in .* is damaged \(UnpicklingError: refusing to load posix.getcwd"):
        load("cifar10", cache=tmp_path)


def test_a_damaged_file_says_to_fetch_again(tmp_path: Path) -> None:
    write(tmp_path / "mnist", {"mnist.npz": b"not a zip file"})
    with pytest.raises(ConfigError, match=r"mnist in .* is damaged .*; delete the folder and run `mldist data fetch"):
        load("mnist", cache=tmp_path)


def test_the_table_pins_a_sha256_for_every_file() -> None:
    assert set(DATASETS) == {"mnist", "fashion_mnist", "cifar10"}
    for ds in DATASETS.values():
        assert ds.base_url.startswith("https://")
        for name, digest in ds.files:
            assert len(digest) == 64 and int(digest, 16) >= 0, name
