"""What the elastic workers share (elastic_fit.py, elastic_keras.py): their data and their model.

The workers import it from their own directory (the script's directory is first on ``sys.path``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: 96 fixed samples: 4 steps of 8 per worker on 3 workers, 6 on 2.
_rng = np.random.default_rng(0)
X = _rng.random((96, 4)).astype(np.float32)
Y = X @ _rng.random((4, 1)).astype(np.float32)


def model(keras: Any) -> Any:
    """A small model with fixed initial weights (the same on every rank and in every run)."""
    init = keras.initializers.GlorotUniform
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="tanh", kernel_initializer=init(1)),
            keras.layers.Dense(1, kernel_initializer=init(2)),
        ]
    )
