"""mldist's start-up hook in the workers its launchers start: their PYTHONPATH names this folder.

Python imports the first ``sitecustomize`` on its path at start-up. This one first imports the
one it shadows (a distribution's or a site's), then looks, in the environment alone, whether this
Python may be a worker: a launcher's rank variable is set, and it is not a Python that a worker
started in turn. Only then does it import mldist and run :func:`mldist.runtime.start.startup.begin`:
the variables other tools read, filled in from mldist's placement where the launcher could not
set them, and a note at exit on whether this worker joined a group. Any other Python (a tool, the
job script's own ``python3``) pays for two look-ups, not for mldist's imports. Nothing here may
stop the user's program: any failure is silent. ``MLDIST_HOOK=0`` (or ``no``, ``false``) switches
it off; ``MLDIST_GROUP_NOTE=0`` only the note (see :mod:`mldist.runtime.start.patches`).
"""

import os
import sys


def _chain() -> None:
    """Import the ``sitecustomize`` that this one shadows, if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved, mine = sys.path[:], sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import sitecustomize  # noqa: F401  (the next one on the path)
    except ImportError:
        pass
    except Exception as exc:  # as site.py reports a failing sitecustomize, and goes on
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        sys.path[:] = saved
        if mine is not None:
            sys.modules["sitecustomize"] = mine


#: The no words of ``mldist.base.envvalues.FALSE``, spelled here: importing mldist to read them would
#: cost every Python started with the hook off (tests/runtime/test_envvalues.py keeps the two alike).
_OFF = ("0", "no", "false")
#: The variables that make a Python a worker: each launcher's rank variable
#: (``mldist.placement.detect.LAUNCHERS``' markers) and ``TF_CONFIG``, spelled here for the same
#: reason (tests/runtime/test_patches.py keeps the two alike).
_MARKERS = (
    "MLDIST_RANK",
    "OMPI_COMM_WORLD_RANK",
    "PALS_RANKID",
    "PMI_RANK",
    "ALPS_APP_PE",
    "SLURM_STEP_ID",
    "PBS_NODEFILE",
    "TF_CONFIG",
)


def _may_be_a_worker() -> bool:
    """Whether this Python may be a worker of a group: the environment alone, nothing of mldist imported."""
    env = os.environ
    if env.get("MLDIST_HOOK", "").strip().lower() in _OFF or env.get("MLDIST_HOOK_SKIP"):  # (mldist's shims)
        return False
    first = env.get("MLDIST_HOOK_PID")  # set by the worker: a Python it starts speaks through it
    if first and first != str(os.getpid()):
        return False
    return any(name in env for name in _MARKERS)


_chain()
if _may_be_a_worker():
    try:
        from mldist.runtime.start import startup

        startup.begin(os.environ)
    except Exception:  # another Python without mldist, a broken install: the program runs as it would
        pass
