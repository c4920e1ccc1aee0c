"""``horovod.tensorflow.functions``' path: object and variable broadcasts."""

from ..objects import allgather_object, broadcast_object, broadcast_object_fn, broadcast_variables

__all__ = ["allgather_object", "broadcast_object", "broadcast_object_fn", "broadcast_variables"]
