"""``horovod.tensorflow.elastic``'s path: present so imports work; its names say what to use instead."""

from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # the import system's questions (``__path__``, ...)
        raise AttributeError(name)
    from .. import refused

    raise refused("elastic", __name__)
