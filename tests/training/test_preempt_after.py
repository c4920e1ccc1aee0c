"""A time-limit warning (SIGUSR1) that comes after the preemption watch ended does not kill the rank."""

from __future__ import annotations

from helpers import run_py

AFTER_WATCH = """
import os, signal, time
from mldist import preempt
with preempt.watch():
    pass  # training ran and finished inside the grace
os.kill(os.getpid(), signal.SIGUSR1)  # Slurm's warning, forwarded by the batch script, comes now
time.sleep(0.2)
print("EXITED CLEANLY", flush=True)
"""


def test_a_late_time_limit_warning_leaves_a_finished_rank_exit_0() -> None:
    res = run_py("-c", AFTER_WATCH)
    assert res.returncode == 0 and "EXITED CLEANLY" in res.stdout, (res.returncode, res.stdout + res.stderr)


def test_a_handler_the_script_had_is_put_back() -> None:
    res = run_py(
        "-c",
        "import signal\nfrom mldist import preempt\nmine = lambda *a: None\nsignal.signal(signal.SIGUSR1, mine)\n"
        "with preempt.watch():\n    pass\nprint(signal.getsignal(signal.SIGUSR1) is mine)",
    )
    assert res.returncode == 0 and res.stdout.split() == ["True"], res.stdout + res.stderr
