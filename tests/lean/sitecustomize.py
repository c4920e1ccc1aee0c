"""Test workers only: TensorFlow and Keras skip their optional imports; processes collect less garbage.

``helpers.clean_env`` puts this folder on ``PYTHONPATH`` for every process a test starts.
``import tensorflow`` loads Keras, and Keras and ``tf.lite`` then import scikit-learn (the
sklearn wrappers), matplotlib (an image-gallery plot) and JAX (the Orbax checkpoint callback,
a tf.lite converter) when they are installed: about 2.7 of 7 CPU seconds of every TensorFlow
worker's start on this machine, and the test suite starts hundreds. TensorFlow's internal
Keras 2 imports scipy.sparse for sparse inputs to its v1 ``fit``: 0.3 to 0.4 CPU-s more. Each of
those imports sits in ``try/except ImportError``, and no test uses the features behind them.

Only imports made by those TensorFlow/Keras modules fail here. The same library imported by a
test's worker, an example or mldist itself (digits from scikit-learn, Keras on JAX, bench's
plots) loads as usual, so nothing mldist does is hidden from the tests.

Where ``MLDIST_TESTS_LEAN_GC=1`` (``helpers.clean_env`` sets it), the process collects garbage
less: TensorFlow leaves 270,000 objects that every full collection walks again. Full collections
come a tenth as often (``gc.set_threshold``; Python's default took 0.25 CPU-s of each ``import
tensorflow`` and as much again in a short fit), and ``gc.freeze()`` runs after every other
``atexit`` handler (mldist's, JAX's), which leaves the interpreter's last collections nothing to
walk (0.5 CPU-s of each exit). A 2-rank launch of digits_cnn.py for 3 epochs took 15.2 against 12.6
CPU-s here (medians of 3). Young objects are still collected as usual, and freeing by reference
count and module teardown still run; objects in reference cycles are finalized later or, at exit,
not at all (Python does not promise it). Processes without the variable collect as a user's do:
those of the tests whose subject is how a worker ends (leaving, stalling, a signal:
``helpers.USERS_GC``) and ranks on other hosts, which do not get it.
"""

from __future__ import annotations

import atexit
import gc
import importlib.abc
import os
import sys
from collections.abc import Sequence
from types import FrameType, ModuleType

#: Importing module (prefix) -> the optional top-level library it does not get.
_SKIPPED = (
    ("keras.src.wrappers", "sklearn"),
    ("keras.src.visualization", "matplotlib"),
    ("keras.src.callbacks.orbax_checkpoint", "jax"),
    ("tensorflow.lite", "jax"),
    ("tensorflow.python.keras", "scipy"),  # TensorFlow's internal Keras 2: scipy.sparse inputs to v1 fit
)
_LIBRARIES = frozenset(lib for _, lib in _SKIPPED)


def _importer(frame: FrameType | None) -> str:
    """The module whose code runs the import: the first frame outside the import system."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(("importlib", "_frozen_importlib")) and name != __name__:
            return str(name)
        frame = frame.f_back
    return ""


class _SkipOptional(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        if fullname in _LIBRARIES:  # the top-level package: its submodules never load without it
            importer = _importer(sys._getframe(1))
            if any(importer.startswith(prefix) and lib == fullname for prefix, lib in _SKIPPED):
                raise ImportError(f"{fullname} is skipped for {importer} in mldist's test workers")
        return None


sys.meta_path.insert(0, _SkipOptional())

if os.environ.get("MLDIST_TESTS_LEAN_GC") == "1":
    young, middle, full = gc.get_threshold()
    gc.set_threshold(young, middle, 10 * full)
    atexit.register(gc.freeze)  # registered first, so it runs last
