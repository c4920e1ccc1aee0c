"""mldist's start-up hook in the workers its launchers start: their PYTHONPATH names this folder.

Python imports the first ``sitecustomize`` on its path at start-up. This one first imports the
one it shadows (a distribution's or a site's), then, in a worker of two or more, runs
:func:`mldist.runtime.startup.begin`: the variables other tools read, filled in from mldist's
placement where the launcher could not set them, and a note at exit on whether this worker
joined a group. Nothing here may stop the user's program: any failure is silent.
``MLDIST_HOOK=0`` (or ``no``, ``false``) switches it off.
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

_chain()
_off = os.environ.get("MLDIST_HOOK", "").strip().lower() in _OFF
if not _off and not os.environ.get("MLDIST_HOOK_SKIP"):  # (mldist's shims)
    try:
        from mldist.runtime import startup

        startup.begin(os.environ)
    except Exception:  # another Python without mldist, a broken install: the program runs as it would
        pass
