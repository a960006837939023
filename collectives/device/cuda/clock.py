"""The timer behind every spin's deadline (NCCL ``src/device/primitives.h``: ``checkAbort`` reads ``*abortFlag``
every ``NCCL_SPINS_BEFORE_CHECK_ABORT`` spins).  Deliberate difference: NCCL has no deadline in the kernel (the
host sets the abort flag); the lab's spins also give up on their own after ``NCCLLAB_TIMEOUT``.

On the GPU: ``%globaltimer`` (``ptx.globaltimer``: nanoseconds, the same on every SM, so one deadline means the
same everywhere).
Under numba's simulator the kernel is plain Python: ``time.monotonic_ns``, and ``pause`` gives up the GIL so that
the other simulated threads (the peer rank's) run while one spins; on a GPU ``pause`` does nothing (NCCL's spins
do not sleep either).
"""
from __future__ import annotations

import time

from numba import cuda
from numba.core import config

# numba's own CUDA target and the numba-cuda package both put the simulator's jit in place of the real one
SIMULATED = bool(getattr(config, "ENABLE_CUDASIM", 0)) or cuda.jit.__module__.startswith("numba.cuda.simulator")

if SIMULATED:
    def now_ns() -> int:
        return time.monotonic_ns()

    def pause() -> None:
        time.sleep(0)
else:  # pragma: no cover - needs a GPU
    # the intrinsic is reached through its module: a global that names the module pickles by reference, so the
    # kernels' disk-cache key (which pickles what their functions refer to) is the same in every process
    from . import ptx

    @cuda.jit(device=True)
    def now_ns():
        return ptx.globaltimer()

    @cuda.jit(device=True)
    def pause():
        """Nothing: a GPU spin is a tight loop of volatile loads, as NCCL's (only the simulator must yield)."""
        return
