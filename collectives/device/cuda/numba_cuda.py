"""``cuda`` for the kernels: numba's module on a GPU; under numba's simulator a stand-in that resolves each name
(``atomic``, ``threadIdx``, ...) in the launch that is running.

Why: the simulator swaps a module's global ``cuda`` for the launch's fake module while a device function runs,
and puts it back when that call returns.  With many simulated threads calling device functions of one module at
once, the first to return restores the real module under the others' feet (numba's own simulator assumes threads
do not interleave inside device functions; spinning threads do).  A global that is not numba's module object is
never swapped, and the simulator allows one launch at a time, so the running launch is well defined.
"""
from __future__ import annotations

from numba import cuda as _numba_cuda
from numba.core import config

if getattr(config, "ENABLE_CUDASIM", 0) or _numba_cuda.jit.__module__.startswith("numba.cuda.simulator"):
    from numba.cuda.simulator.kernel import _get_kernel_context

    class _LaunchCuda:
        def __getattr__(self, name):
            ctx = _get_kernel_context()
            return getattr(ctx if ctx is not None and hasattr(ctx, name) else _numba_cuda, name)

    cuda = _LaunchCuda()
else:
    cuda = _numba_cuda
