"""``horovod.common.exceptions``' path: the two exceptions Horovod's elastic scripts catch.

mldist never raises them for a lost rank (the group ends and restarts instead, see
``mldist run --max-restarts``); they exist so that ``except`` clauses import.
"""


class HorovodInternalError(RuntimeError):
    """A collective failed because a rank was lost."""


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed while training (elastic mode).

    Args:
        skip_sync: whether the state need not be synchronised again.
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync
