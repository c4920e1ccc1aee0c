"""The one exception family of mldist.

Every error a user can cause names the offending value and the fix, so the
CLI can print it as a single line (exit code 2) instead of a traceback.

Example::

    raise ConfigError("MLDIST_PORT_BASE='abc' is not a port; set it to 1024-53535")
"""

from __future__ import annotations

#: Exit code (EX_TEMPFAIL) of workers that saved a checkpoint and ask to be started again.
REQUEUE_CODE = 75
#: Exit code of elastic workers that left at a commit so that the world re-forms with the hosts that joined.
REFORM_CODE = 76


class MldistError(Exception):
    """Base class of every error raised on purpose by mldist."""

    # TensorFlow's autograph rewrites errors raised while tracing into a
    # multi-line "in user code" message; ours already say what to do.
    ag_pass_through = True


class ConfigError(MldistError, ValueError):
    """A setting, flag or environment variable has a value mldist cannot use."""


class DetectionError(MldistError):
    """The launcher's environment is incomplete or contradictory."""


class LaunchError(MldistError):
    """Workers could not be started or a port could not be bound."""


class RuntimeStateError(MldistError, RuntimeError):
    """An API was used in the wrong order (e.g. before mldist.init())."""


class NotInitializedError(RuntimeStateError, ValueError):
    """Horovod's API used before ``hvd.init()`` (a ValueError there, so old handlers still catch it)."""


class CheckpointError(MldistError):
    """A checkpoint is damaged, does not fit the model, or cannot be written."""


class CollectiveMismatch(MldistError, ValueError):
    """Ranks passed different shapes, dtypes or roots to one collective; raised on every rank alike.

    Inside a graph TensorFlow reports it as an ``InvalidArgumentError`` holding this text;
    eager calls of mldist's collectives raise it as a ``tf.errors.FailedPreconditionError``
    (Horovod's type) that is also this class's sibling (:func:`mldist.runtime.watch.failures.mismatch`).
    """


class UnsupportedError(MldistError, NotImplementedError):
    """A feature mldist deliberately does not provide; the message names what to use instead."""
