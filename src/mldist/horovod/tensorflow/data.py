"""``horovod.tensorflow.data``'s path: Horovod's tf.data compute service is not provided."""

from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # the import system's questions (``__path__``, ...)
        raise AttributeError(name)
    from .. import refused

    raise refused("data", __name__)
