"""Which Keras a Horovod-style script trains with: tf_keras under TF_USE_LEGACY_KERAS=1, else Keras 3.

That is TensorFlow's own rule for ``tf.keras``, so ``mldist.horovod.keras``
and ``mldist.horovod.tensorflow.keras`` both match the model's Keras.

Example::

    keras = keras_module()
    keras.callbacks.Callback
"""

from __future__ import annotations

import os
from typing import Any


def legacy_requested(env: dict[str, str] | None = None) -> bool:
    """Whether TensorFlow's ``tf.keras`` is tf_keras in this process (TF_USE_LEGACY_KERAS).

    Example:
        >>> legacy_requested({"TF_USE_LEGACY_KERAS": "1"}), legacy_requested({})
        (True, False)
    """
    value = (os.environ if env is None else env).get("TF_USE_LEGACY_KERAS", "")
    return value.strip().lower() in ("1", "true", "yes")


def keras_module() -> Any:
    """The Keras package ``tf.keras`` resolves to here."""
    if legacy_requested():
        import tf_keras

        return tf_keras
    import keras

    return keras
