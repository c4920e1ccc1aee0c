"""The benchmark models: the README's example CNN and Keras's MobileNetV2 (weights=None).

Example::

    model, shape, batch = build("cnn")   # (28, 28, 1), batch 64
"""

from __future__ import annotations

from typing import Any

SHAPES = {"cnn": (28, 28, 1), "mobilenetv2": (64, 64, 3)}
BATCHES = {"cnn": 64, "mobilenetv2": 32}


def build(name: str) -> tuple[Any, tuple[int, ...], int]:
    """A fresh Keras model, its input shape and its default per-worker batch."""
    import keras

    shape = SHAPES[name]
    if name == "mobilenetv2":
        return keras.applications.MobileNetV2(weights=None, input_shape=shape, classes=10), shape, BATCHES[name]
    layers = keras.layers
    model = keras.Sequential(
        [
            keras.Input(shape),
            layers.Conv2D(32, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(64, activation="relu"),
            layers.Dense(10, activation="softmax"),
        ]
    )
    return model, shape, BATCHES[name]
