"""What ``mldist.init()`` does to TensorFlow in a worker, and whether the worker needs TensorFlow at all.

A numpy or mpi4py script under the MPI engine (or alone) never imports TensorFlow: its start costs a
tenth of the file-system calls (see docs/guides/performance.md). TensorFlow starts at ``init`` where the
script already imported it (or Keras, which imports it), where GPUs are listed (NCCL and the GPU's pin
are TensorFlow's), or where the engine is TensorFlow's own (RING, NCCL). A script that imports it after
``init`` gets the same thread pools and autograph rule as it is imported
(:func:`mldist.runtime.start.patches.tensorflow_on_import`).

Example::

    if uses_tensorflow(sys.modules, os.environ):
        import tensorflow as tf
        apply_threads(tf, plan, None)
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Container, Mapping
from typing import Any

from ...base import processwide
from ...placement import Placement
from ...placement.resources import ThreadPlan, choose_gpu
from . import patches

#: Modules whose presence at ``init`` says the script runs TensorFlow (Keras on TensorFlow imports it).
TENSORFLOW_MODULES = ("tensorflow", "keras", "tf_keras")
#: Where the NVIDIA driver lists its GPUs, one entry each.
DRIVER_GPUS = "/proc/driver/nvidia/gpus"


def listed_gpus(env: Mapping[str, str], listed: list[str]) -> bool:
    """Whether a GPU this process may use is listed (``listed``: the driver's entries).

    Example:
        >>> listed_gpus({}, ["0000:01:00.0"]), listed_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, ["x"]), listed_gpus({}, [])
        (True, False, False)
    """
    visible = env.get("CUDA_VISIBLE_DEVICES")
    return bool(listed) and (visible is None or any(d.strip() not in ("", "-1") for d in visible.split(",")))


def uses_tensorflow(modules: Container[str], env: Mapping[str, str]) -> bool:
    """Whether ``init`` starts TensorFlow now, before its engine is decided: the script imported it
    (``modules``: ``sys.modules``) or Keras, or the driver lists a GPU this process may use."""
    if any(name in modules for name in TENSORFLOW_MODULES):
        return True
    try:
        listed = os.listdir(DRIVER_GPUS)
    except OSError:
        return False
    return listed_gpus(env, listed)


def apply_threads(tf: Any, plan: ThreadPlan, soft_placement: bool | None) -> None:
    """TensorFlow's thread pools from ``plan``, and its soft placement when given."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(plan.intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(plan.inter_op)
        if soft_placement is not None:  # the guides' ConfigProto(allow_soft_placement=True)
            tf.config.set_soft_device_placement(soft_placement)
    except RuntimeError:
        warnings.warn(
            "mldist.init() came after TensorFlow started running ops; thread pools "
            "were left as they are. Call mldist.init() first.",
            stacklevel=3,
        )


def pin_gpu(tf: Any, spec: Placement) -> int | None:
    """This rank's GPU made the only visible one (all of them for one process per node); its index or None."""
    gpus = tf.config.list_physical_devices("GPU")
    # One process per node keeps all its GPUs (MirroredStrategy uses them).
    keep_all = spec.local_size == 1 and len(gpus) > 1
    chosen = None if keep_all else choose_gpu(len(gpus), spec.local_rank, spec.local_size)
    try:
        if chosen is not None:
            tf.config.set_visible_devices([gpus[chosen]], "GPU")
        for gpu in [gpus[chosen]] if chosen is not None else gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:
        warnings.warn(
            "mldist.init() came after TensorFlow initialised its GPUs; every GPU stays "
            "visible. Call mldist.init() before building models.",
            stacklevel=3,
        )
    return chosen


def pool_sizes(plan: ThreadPlan) -> None:
    """TensorFlow's pool sizes in the environment, for a TensorFlow imported later (it reads them as it starts);
    a value the user set wins.

    Args:
        plan: the thread plan of this rank.
    """
    processwide.env_default(_POOLS, "TF_NUM_INTRAOP_THREADS", str(plan.intra_op))
    processwide.env_default(_POOLS, "TF_NUM_INTEROP_THREADS", str(plan.inter_op))


#: The entry of :data:`mldist.base.processwide.PATCHES` :func:`pool_sizes` makes.
_POOLS = "os.environ: TensorFlow's pool sizes"


def later(plan: ThreadPlan, soft_placement: bool | None) -> None:
    """Prepare a worker whose ``init`` ran without TensorFlow for a later import of it: the pool sizes in the
    environment (TensorFlow reads them as it starts), the rest once it is imported."""
    pool_sizes(plan)

    def imported(tf: Any) -> None:
        patches.autograph_leaves_mldist()
        apply_threads(tf, plan, soft_placement)

    patches.tensorflow_on_import(imported)
