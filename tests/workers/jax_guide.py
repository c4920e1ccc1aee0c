"""JAX's multi-process guide as issue 51 quotes it, its four lines unchanged: no mldist, no arguments.

Usage: python jax_guide.py (each rank prints its process index, count and global device count, then the psum).
"""

import jax

jax.distributed.initialize()
print(jax.process_index(), jax.process_count(), jax.device_count())
print(jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")(jax.numpy.ones(jax.local_device_count())))
