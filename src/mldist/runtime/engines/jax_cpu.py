"""JAX's CPU collectives: which implementation, and Gloo's event loop kept out of the step's way.

On CPU-only workers JAX runs the training step's all-reduce through Gloo over TCP unless
``JAX_CPU_COLLECTIVES_IMPLEMENTATION`` says otherwise (``mpi``: JAX's MPI collectives, which
load the site's MPI through MPItrampoline's ``MPITRAMPOLINE_LIB``). mldist keeps a user's
choice and picks Gloo when there is none.

Gloo's TCP transport polls its sockets from one event-loop thread per process (``epoll``,
level-triggered). When a peer's data arrives before this rank posted the receive, the usual
case since one rank always finishes its backward pass first, the socket stays readable and
the loop spins until the receive is posted (gloo#246 is the upstream issue about this loop).
On a rank that owns one core the spin takes that core from the thread that computes and then
posts the receive; the kernel hands it back at its next tick. Measured on this project's
2-core test machine: a 1.4 MB all-reduce over 2 processes took 4.0 ms (median) instead of
0.59 ms; the CNN benchmark reached 0.74 of two separate processes instead of 0.91, MobileNetV2
0.70 instead of 0.88.

:func:`idle_event_loops` moves that thread to ``SCHED_IDLE``: it runs whenever the core has
nothing else to run (while the step waits for the collective), never in front of the step.
The thread is found by what it waits in: ``epoll_wait`` with Gloo's 64 events and 10 ms.

Example::

    jax.config.update("jax_cpu_collectives_implementation", implementation(os.environ))
    ...                              # jax.distributed.initialize(), then jax.devices()
    idle_event_loops()               # [12345]: the thread ids moved to SCHED_IDLE
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Mapping
from pathlib import Path

from ...base import envvalues

#: A user's choice of JAX's CPU collectives (JAX reads it too); mldist's default.
CHOICE_ENV = "JAX_CPU_COLLECTIVES_IMPLEMENTATION"
DEFAULT = "gloo"
#: ``MLDIST_GLOO_IDLE=0`` leaves Gloo's event loop at normal priority (for comparison).
IDLE_ENV = envvalues.GLOO_IDLE.name
#: System call numbers of epoll_wait and epoll_pwait, by machine (``platform.machine()``).
EPOLL_CALLS = {
    "x86_64": ("232", "281"),
    "aarch64": ("22",),  # arm64 has epoll_pwait only
    "ppc64le": ("236", "303"),
}
#: Gloo's ``tcp::Loop::run``: ``epoll_wait(fd, events, 64, 10)``.
GLOO_MAX_EVENTS, GLOO_TIMEOUT_MS = 64, 10


def implementation(env: Mapping[str, str]) -> str:
    """JAX's CPU collectives for this worker: the user's ``JAX_CPU_COLLECTIVES_IMPLEMENTATION``, else Gloo.

    Example:
        >>> implementation({}), implementation({"JAX_CPU_COLLECTIVES_IMPLEMENTATION": "mpi"})
        ('gloo', 'mpi')
    """
    return env.get(CHOICE_ENV, "").strip() or DEFAULT


def wants_idle_loop(collectives: str, env: Mapping[str, str]) -> bool:
    """Whether to move Gloo's event loop to ``SCHED_IDLE``: on Gloo, unless ``MLDIST_GLOO_IDLE`` is a no (0, no, false).

    Example:
        >>> wants_idle_loop("gloo", {}), wants_idle_loop("gloo", {"MLDIST_GLOO_IDLE": "0"}), wants_idle_loop("mpi", {})
        (True, False, False)
    """
    return collectives == DEFAULT and envvalues.GLOO_IDLE.read(env)


def is_event_loop(syscall: str, machine: str) -> bool:
    """Whether a thread's ``/proc/.../syscall`` line shows it waiting where Gloo's event loop waits.

    Args:
        syscall: the file's text: the call's number and its arguments in hex, or "running".
        machine: ``platform.machine()``.

    Example:
        >>> is_event_loop("232 0xc 0x7f4b717feb30 0x40 0xa 0x0 0x0 0x7f4b 0x7f4b", "x86_64")
        True
        >>> is_event_loop("232 0x5 0x7f4b717feb30 0x64 0x1f4 0x0 0x0 0x7f4b 0x7f4b", "x86_64")
        False
        >>> is_event_loop("running", "x86_64"), is_event_loop("232 0xc 0x0 0x40 0xa", "riscv64")
        (False, False)
    """
    fields = syscall.split()
    if len(fields) < 5 or fields[0] not in EPOLL_CALLS.get(machine, ()):
        return False
    try:
        return int(fields[3], 16) == GLOO_MAX_EVENTS and int(fields[4], 16) == GLOO_TIMEOUT_MS
    except ValueError:
        return False


def event_loops(tasks: Path = Path("/proc/self/task"), machine: str | None = None) -> set[int]:
    """Thread ids of this process that wait where Gloo's event loop waits, now."""
    found = set()
    for task in tasks.iterdir():
        try:
            text = (task / "syscall").read_text()
        except OSError:  # the thread ended, or this kernel hides the file
            continue
        if is_event_loop(text, machine or platform.machine()):
            found.add(int(task.name))
    return found


def idle_event_loops(tries: int = 20, pause: float = 0.005) -> list[int]:
    """Move Gloo's event-loop thread(s) to ``SCHED_IDLE``; the ids moved (none found: []).

    The loop spends nearly all its time inside ``epoll_wait`` while no collective runs, so a
    few looks find it; ``tries`` x ``pause`` bounds the search (0.1 s) where there is none.
    """
    found: set[int] = set()
    for attempt in range(tries):
        found |= event_loops()
        if found and attempt >= 2:
            break
        time.sleep(pause)
    moved = []
    for tid in sorted(found):
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            moved.append(tid)
        except OSError:  # the thread ended, or a seccomp profile forbids it
            continue
    return moved
