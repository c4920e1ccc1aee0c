"""Which Keras backend a worker runs, decided once, without importing Keras.

Keras reads ``KERAS_BACKEND`` first, then ``backend`` in ``$KERAS_HOME/keras.json``
(default ``~/.keras/keras.json``), else uses TensorFlow. Once Keras is imported its
own answer wins: a script may set the variable itself before ``import keras``.

Example:
    >>> keras_backend({"KERAS_BACKEND": "jax"})
    'jax'
    >>> keras_backend({}, config_text='{"backend": "torch"}')
    'torch'
    >>> keras_backend({})
    'tensorflow'
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

#: Backends mldist runs, and the one it names but does not run yet.
SUPPORTED = ("tensorflow", "jax")
BACKENDS = (*SUPPORTED, "torch", "numpy", "openvino")
DEFAULT = "tensorflow"

#: Why a backend cannot be used, in one line.
REFUSED = {
    "torch": "KERAS_BACKEND=torch is not supported by mldist yet; use 'jax' or 'tensorflow'",
    "numpy": "KERAS_BACKEND=numpy cannot train (Keras's numpy backend has no gradients); use 'jax' or 'tensorflow'",
    "openvino": "KERAS_BACKEND=openvino is for inference only; use 'jax' or 'tensorflow' to train",
}


@dataclass(frozen=True)
class Traits:
    """What a backend mldist runs means for the rest of mldist: code asks these, never the name.

    Args:
        runs_tensorflow: Keras runs the model in TensorFlow: tf.distribute, TensorFlow's profiler,
            TensorFlow's engines and mldist's collectives on TensorFlow tensors apply. Else the
            collectives take host arrays (numpy, JAX) and return numpy arrays.
        averages_in_step: Keras's compiled step averages the gradients itself (the
            ``keras.distribution.DataParallel`` that ``init`` sets over every process and device):
            optimizer and tape wrappers have nothing to add, and the backend brings its own engine,
            whatever ``--communication`` says.
        packages: the distributions Keras needs for it, beside TensorFlow (``mldist[jax]`` installs JAX's).
    """

    runs_tensorflow: bool
    averages_in_step: bool
    packages: tuple[str, ...] = ()


#: The traits of each backend mldist runs (:data:`SUPPORTED`).
TRAITS = {
    "tensorflow": Traits(runs_tensorflow=True, averages_in_step=False),
    "jax": Traits(runs_tensorflow=False, averages_in_step=True, packages=("jax", "jaxlib")),
}


def traits(name: str) -> Traits:
    """The traits of backend ``name``; ConfigError for one mldist does not run.

    Example:
        >>> traits("jax").averages_in_step, traits("tensorflow").runs_tensorflow
        (True, True)
    """
    return TRAITS[check_supported(name)]


def config_path(env: Mapping[str, str]) -> Path:
    """Keras's ``keras.json``: under ``KERAS_HOME``, else ``~/.keras``.

    Example:
        >>> str(config_path({"KERAS_HOME": "/k"}))
        '/k/keras.json'
    """
    home = env.get("KERAS_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".keras")
    return Path(home) / "keras.json"


def _from_config(text: str | None) -> str | None:
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None  # Keras itself ignores a broken keras.json
    value = data.get("backend") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def keras_backend(env: Mapping[str, str], config_text: str | None = None, loaded: str | None = None) -> str:
    """The Keras backend of this process.

    Args:
        env: the environment (``KERAS_BACKEND``).
        config_text: the contents of ``keras.json``, if any.
        loaded: ``keras.config.backend()`` when Keras is already imported (it wins).

    Example:
        >>> keras_backend({"KERAS_BACKEND": "jax"}, loaded="tensorflow")
        'tensorflow'
    """
    name = loaded or env.get("KERAS_BACKEND") or _from_config(config_text) or DEFAULT
    if name not in BACKENDS:
        raise ConfigError(f"KERAS_BACKEND={name!r} is not one of {', '.join(BACKENDS)}")
    return name


def check_supported(name: str) -> str:
    """``name`` when mldist can train on it, else ConfigError with the one-line reason.

    Example:
        >>> check_supported("jax")
        'jax'
    """
    if name in REFUSED:
        raise ConfigError(REFUSED[name])
    return name


def refusal(env: Mapping[str, str]) -> str:
    """Why ``mldist run`` and ``init()`` refuse the Keras backend the workers of ``env`` would find, in
    one line: the same checks (:func:`keras_backend`, :func:`check_supported`); "" when mldist runs it.

    Example:
        >>> refusal({"KERAS_BACKEND": "torch"})
        "KERAS_BACKEND=torch is not supported by mldist yet; use 'jax' or 'tensorflow'"
        >>> refusal({"KERAS_BACKEND": "jax"})
        ''
    """
    try:
        check_supported(keras_backend(env, read_config(env)))
    except ConfigError as exc:
        return str(exc)
    return ""


def read_config(env: Mapping[str, str]) -> str | None:
    """The text of ``keras.json``, or None when there is none or it cannot be read."""
    try:
        return config_path(env).read_text()
    except OSError:
        return None


def described(env: Mapping[str, str]) -> str:
    """The backend the workers of ``env`` will find, for records (a bad name is shown as it is).

    Example:
        >>> described({"KERAS_BACKEND": "jax", "HOME": "/nonexistent"}), described({"KERAS_BACKEND": "x"})
        ('jax', 'x (not one of tensorflow, jax, torch, numpy, openvino)')
    """
    try:
        return keras_backend(env, read_config(env))
    except ConfigError:
        return f"{env.get('KERAS_BACKEND')} (not one of {', '.join(BACKENDS)})"
