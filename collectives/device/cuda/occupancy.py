"""Whether a launch can run at all before it is made (NCCL ``src/enqueue.cc``: ``ncclLaunchKernel`` launches one
block per channel, and its primitives assume every block of every rank runs at once).  A persistent kernel whose
blocks spin on each other deadlocks when some of them wait for an SM that the others hold, and a rank's kernel
queued behind another's spinning kernel never starts: both would end in the spin deadline, minutes of a GPU's time
for one line.  These checks refuse such a launch in one line instead.

* ``blocks_per_sm``: the blocks of ``nthreads`` threads one SM holds, from the kernel's registers per thread
  (a warp's registers are allocated in units of 256; an SM has 65,536 registers, 64 warps and 32 blocks on
  sm_80/sm_90); the driver's own figure (``cuOccupancyMaxActiveBlocksPerMultiprocessor``, through numba's
  ``max_cooperative_grid_blocks``) is the one ``check_launch`` uses, this one explains it.
* ``residency``: ``nblocks`` (ranks on this GPU x channels) against SMs x blocks per SM.
* ``connections``: ranks as threads, one stream each, need ``CUDA_DEVICE_MAX_CONNECTIONS`` >= n hardware queues
  (8 by default, at most 32); it is read when CUDA starts, so it must be set before.
Deliberate difference: NCCL checks neither before a launch; the lab does, because its kernels use more registers
than NCCL's and several of its ranks share one GPU.
"""
from __future__ import annotations

import os

from collectives.device.common import CollectiveError
from collectives.include.bitops import div_up, round_up
from collectives.include.device import WARP_SIZE

REGS_PER_SM, WARPS_PER_SM, BLOCKS_PER_SM, REG_UNIT = 65536, 64, 32, 256
MAX_CONNECTIONS, DEFAULT_CONNECTIONS = 32, 8


class LaunchError(CollectiveError):
    """A launch that could never complete; the message is one line."""


def blocks_per_sm(regs_per_thread: int, nthreads: int) -> int:
    """Blocks of ``nthreads`` threads one SM holds when each thread uses ``regs_per_thread`` registers."""
    warps = div_up(nthreads, WARP_SIZE)
    per_warp = round_up(regs_per_thread * WARP_SIZE, REG_UNIT)
    by_regs = (REGS_PER_SM // per_warp) // warps if per_warp else BLOCKS_PER_SM
    return max(0, min(by_regs, WARPS_PER_SM // warps, BLOCKS_PER_SM))


def residency(nblocks: int, nthreads: int, regs_per_thread: int, per_sm: int, sm_count: int, who: str) -> str | None:
    """None when all ``nblocks`` blocks fit at once, else the one-line refusal."""
    if nblocks <= per_sm * sm_count:
        return None
    return (f"{who}: {nblocks} blocks of {nthreads} threads cannot all be resident at once: the kernel uses "
            f"{regs_per_thread} registers per thread, so {per_sm} block(s) fit on each of the {sm_count} SMs "
            f"({per_sm * sm_count} in all); use fewer channels (NCCL_MAX_NCHANNELS) or fewer ranks on this GPU")


def connections(nstreams: int, env=None) -> str | None:
    """None when ``nstreams`` concurrent kernels each get their own hardware queue, else the one-line refusal."""
    env = os.environ if env is None else env
    raw = env.get("CUDA_DEVICE_MAX_CONNECTIONS", "").strip()
    have = int(raw) if raw.isdigit() else DEFAULT_CONNECTIONS
    if nstreams > MAX_CONNECTIONS:
        return (f"{nstreams} ranks as threads on one GPU: CUDA has at most {MAX_CONNECTIONS} hardware queues "
                f"(CUDA_DEVICE_MAX_CONNECTIONS), so some rank's kernel would wait behind a spinning one")
    if have < nstreams:
        return (f"{nstreams} ranks as threads on one GPU need CUDA_DEVICE_MAX_CONNECTIONS >= {nstreams} (it is "
                f"{have}{'' if raw else ', the default'}); set it before CUDA starts, or a rank's kernel queued "
                f"behind a spinning one never starts")
    return None


def check_launch(kernel, args, nblocks: int, nthreads: int, who: str) -> dict:  # pragma: no cover - needs a GPU
    """Compile ``kernel`` for ``args`` (numba device arrays) if needed and refuse (``LaunchError``) a launch of
    ``nblocks`` blocks that cannot all be resident; returns what it found (registers, blocks per SM, SMs)."""
    sig = tuple(kernel.typeof_pyval(a) for a in args)
    compiled = kernel.compile(sig)
    regs = int(compiled.regs_per_thread)
    from numba import cuda
    sms = int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    per_sm = int(compiled.max_cooperative_grid_blocks(nthreads)) // sms
    limit = int(compiled.max_threads_per_block)
    found = {"regs_per_thread": regs, "local_bytes_per_thread": int(compiled.local_mem_per_thread),
             "max_threads_per_block": limit, "blocks_per_sm": per_sm,
             "blocks_per_sm_from_regs": blocks_per_sm(regs, nthreads), "sm_count": sms}
    if nthreads > limit:
        raise LaunchError(f"{who}: blocks of {nthreads} threads cannot launch: the kernel uses {regs} registers per "
                          f"thread, which allows {limit} threads per block")
    msg = residency(nblocks, nthreads, regs, per_sm, sms, who)
    if msg:
        raise LaunchError(msg)
    return found
