"""The timer behind every spin's deadline (NCCL ``src/device/common.h`` checks ``*abortFlag`` while spinning; a GPU
clock read is what ``clock64()`` gives NCCL's ``checkAbort``).

On the GPU: ``%globaltimer`` (nanoseconds, the same on every SM, so one deadline means the same everywhere).
Under numba's simulator the kernel is plain Python: ``time.monotonic_ns``, and ``pause`` gives up the GIL so that
the other simulated threads (the peer rank's) run while one spins.
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
    from llvmlite import ir
    from numba import types
    try:
        from numba.cuda.extending import intrinsic  # the numba-cuda package
    except ImportError:
        from numba.core.extending import intrinsic

    @intrinsic
    def _globaltimer(typingctx):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(64), []), "mov.u64 $0, %globaltimer;", "=l",
                               side_effect=True)
            return builder.call(asm, [])
        return types.int64(), codegen

    @cuda.jit(device=True)
    def now_ns():
        return _globaltimer()

    @cuda.jit(device=True)
    def pause():
        cuda.nanosleep(64)
