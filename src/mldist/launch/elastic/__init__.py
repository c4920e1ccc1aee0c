"""Elastic worlds: one supervisor for ``mldist run -H ... --min-np`` and for elastic Slurm jobs.

A lost host (node) ends the round; the supervisor probes the hosts, stops what is left of the round,
and starts the workers again on the hosts that answer, or ends. The loop, its states, the one
re-forming record and the bounded probe are in :mod:`.supervisor`; what differs is in the hooks:

- :mod:`.onhosts`: ``-H``/``--hostfile`` runs (mpiexec over ssh, hosts probed with ssh ``true``,
  the discovery script); ``mldist.launch.local`` runs an elastic run's rounds through the supervisor
  (a fixed world's, ``--max-restarts``, in a plain loop).
- :mod:`.slurm`: the agent inside an elastic Slurm job (srun steps, nodes probed with a one-task
  ``true`` step), started by the batch script as ``python3 -m mldist.launch.batch.agent``.

The names of :mod:`.onhosts` and :mod:`.supervisor` are re-exported here, where callers import them.

Example:
    >>> plan((("hx1", 1), ("hx2", 1), ("hx3", 1)), {"hx3"}, min_np=2, max_np=3)
    ((('hx1', 1), ('hx2', 1)), 2)
"""

from __future__ import annotations

from .onhosts import (
    DISCOVER_EVERY,
    DISCOVERY_TIMEOUT,
    FAILED_ON,
    LOST_DAEMON,
    PROBE_EVERY,
    PROBE_TIMEOUT,
    RESUMED,
    RUN_ENV,
    Watch,
    answering,
    discover,
    forget,
    grow,
    lost_hosts,
    named_hosts,
    parse_discovered,
    plan,
    reform,
    ssh_agent,
)
from .supervisor import Recovery, Reform, RunResult, Supervisor, WorkerState

__all__ = [
    "DISCOVERY_TIMEOUT",
    "DISCOVER_EVERY",
    "FAILED_ON",
    "LOST_DAEMON",
    "PROBE_EVERY",
    "PROBE_TIMEOUT",
    "RESUMED",
    "RUN_ENV",
    "Recovery",
    "Reform",
    "RunResult",
    "Supervisor",
    "Watch",
    "WorkerState",
    "answering",
    "discover",
    "forget",
    "grow",
    "lost_hosts",
    "named_hosts",
    "parse_discovered",
    "plan",
    "reform",
    "ssh_agent",
]
