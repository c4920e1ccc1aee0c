"""mldist.data in this process (one worker): shuffling, replay and resume positions."""

from __future__ import annotations

from typing import Any

import pytest

# Other in-process tests may have run TensorFlow ops before init() set the thread pools.
pytestmark = pytest.mark.filterwarnings("ignore:mldist.init\\(\\) came after")
tf = pytest.importorskip("tensorflow")
data = pytest.importorskip("mldist.data")


@pytest.fixture(autouse=True)
def _no_global_seed_afterwards() -> Any:
    yield
    tf.random.set_seed(None)


def _epochs(ds: Any, n: int) -> list[list[int]]:
    return [[int(v) for batch in ds for v in batch.numpy()] for _ in range(n)]


def _dataset(n: int) -> Any:
    return tf.data.Dataset.from_tensor_slices(tf.range(n, dtype=tf.int64))


def test_shuffle_under_a_global_seed_of_0_permutes_each_epoch_and_replays() -> None:
    """A global seed of 0 (keras.utils.set_random_seed(0)) broke Dataset.shuffle with a tensor seed."""
    tf.random.set_seed(0)
    first = _epochs(data.shard(_dataset(40), 8, shuffle_buffer=40, seed=5), 3)
    for epoch in first:
        assert sorted(epoch) == list(range(40))  # a full permutation: nothing lost or repeated
    assert first[0] != list(range(40)) and first[0] != first[1] != first[2]
    # The same (seed, rank, epoch) gives the same order in a new run, whatever the global seed.
    tf.random.set_seed(123)
    assert _epochs(data.shard(_dataset(40), 8, shuffle_buffer=40, seed=5), 3) == first
    assert _epochs(data.shard(_dataset(40), 8, shuffle_buffer=40, seed=6), 1)[0] != first[0]


def test_a_saved_position_resumes_at_that_batch_of_that_epoch() -> None:
    full = _epochs(data.shard(_dataset(40), 8, shuffle_buffer=40, seed=5), 3)
    again = data.shard(_dataset(40), 8, shuffle_buffer=40, seed=5)
    data.STREAMS[-1].position.assign(5 + 2)  # epoch 1, batch 2 (5 batches of 8 per epoch)
    # The next "epoch" is one epoch's worth of batches from there: the rest of epoch 1, then epoch 2.
    assert _epochs(again, 1)[0] == full[1][16:] + full[2][:16]
    assert int(data.STREAMS[-1].position.numpy()) == 7 + 5


def test_small_window_permutes_within_windows() -> None:
    (epoch,) = _epochs(data.shard(_dataset(12), 3, shuffle_buffer=4, seed=1), 1)
    assert [sorted(epoch[i : i + 4]) for i in (0, 4, 8)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert epoch != list(range(12))


# issue 47: shard takes numpy arrays as the README says, and names anything else.
def test_numpy_parts_are_the_rows_dataset_shard_keeps_for_each_rank() -> None:
    np = pytest.importorskip("numpy")
    x, y = np.arange(10).reshape(10, 1), np.arange(10) * 10
    parts = [data.sharding.numpy_part({"in": x, "out": (y,)}, rank, 3) for rank in range(3)]
    for rank, part in enumerate(parts):
        kept = [int(v) for v in tf.data.Dataset.range(10).shard(3, rank)]
        assert part["in"][:, 0].tolist() == kept and part["out"][0].tolist() == [10 * k for k in kept]
    assert sorted(v for p in parts for v in p["in"][:, 0].tolist()) == list(range(10))  # nothing lost or doubled


def test_shard_of_a_tuple_of_numpy_arrays_gives_batches_of_its_rows() -> None:
    np = pytest.importorskip("numpy")
    x, y = np.arange(40, dtype=np.float32).reshape(20, 2), np.arange(20)
    batches = list(data.shard((x, y), 8))
    assert len(batches) == 2 and batches[0][0].shape == (8, 2)  # 20 rows: two full batches of 8
    assert [int(v) for b in batches for v in b[1].numpy()] == list(range(16))
    assert np.array_equal(batches[1][0].numpy(), x[8:16])


def _numpy(name: str) -> Any:
    import numpy as np

    return {"two-lengths": (np.zeros(20), np.zeros(19)), "0-dim": np.array(1.0), "scalar": np.float32(1)}[name]


@pytest.mark.parametrize(
    ("given", "fragment"),
    [
        ([[1, 2], [3, 4]], "shard takes a tf.data.Dataset or numpy arrays (an array, or a tuple or dict of arrays"),
        ([[1, 2], [3, 4]], "got list (a list: give a tuple of arrays, or np.asarray(...) it)"),
        ("train.csv", "; got str"),
        (({"a": 1},), "; got int at [0]['a']"),
        ("scalar", "; got numpy.float32"),
        ("two-lengths", "shard got arrays of different lengths ([0]: 20, [1]: 19)"),
        ("0-dim", "shard got a 0-dimensional array (one value, no elements to shard)"),
    ],
)
def test_shard_names_what_it_cannot_take(given: Any, fragment: str) -> None:
    given = _numpy(given) if given in ("two-lengths", "0-dim", "scalar") else given
    with pytest.raises(data.sharding.ConfigError) as caught:
        data.shard(given, 8)
    assert fragment in str(caught.value), caught.value


@pytest.mark.parametrize("given", ["data/*.tfrecord", b"data/a.tfrecord", 3])
def test_shard_files_refuses_a_pattern_or_a_single_name(given: Any) -> None:
    """A string is iterable: its characters were read as file names, one rank's a few letters."""
    with pytest.raises(data.sharding.ConfigError, match=r"shard_files takes a list of file names, got .*glob"):
        data.shard_files(given, tf.data.TFRecordDataset, 8)


def test_shard_files_takes_paths_from_pathlib(tmp_path: Any) -> None:
    files = []
    for i in range(2):
        files.append(tmp_path / f"{i}.txt")
        files[-1].write_text("".join(f"{i}{k}\n" for k in range(4)))
    batches = list(data.shard_files(sorted(tmp_path.glob("*.txt")), tf.data.TextLineDataset, 4))
    assert sorted(v.decode() for b in batches for v in b.numpy()) == [f"{i}{k}" for i in range(2) for k in range(4)]
