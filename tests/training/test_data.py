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
