"""``horovod.common``'s path: the exceptions Horovod scripts catch, and the process queries.

Example::

    from mldist.horovod.common.exceptions import HorovodInternalError
"""

from .. import basics as basics
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "basics"]
