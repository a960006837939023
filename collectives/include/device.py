"""What kernels, proxies and the host share (NCCL ``src/include/device.h``): ``NCCL_STEPS``, ``MAXCHANNELS``,
``WARP_SIZE``, the thread maxima, the functions' names (``ncclFuncStr``, in ``ncclFunc_t``'s order) and the LL flag.
The connector (``ncclConnInfo``) is in ``connector.py``, the protocol descriptors in ``protocols.py``."""
from __future__ import annotations

from collectives.misc.param import env_int

NCCL_STEPS = 8      # FIFO slots of every connection, all protocols
MAXCHANNELS = 64    # channels per communicator
WARP_SIZE = 32
NCCL_MAX_NTHREADS = 640
NCCL_SIMPLE_MAX_NTHREADS = NCCL_LL_MAX_NTHREADS = 512
NCCL_LL128_MAX_NTHREADS = 640
FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")  # ncclFuncStr
# NCCL_LL_FLAG(a) and NCCL_LL_CLEAN_MASK; NCCL's test build shrinks both (a % 0x100, 0x78), and so do these knobs,
# for the wrap-around tests.
LL_FLAG_MOD = env_int("NCCLLAB_LL_FLAG_MOD", 1 << 32)
LL_CLEAN_MASK = env_int("NCCLLAB_LL_CLEAN_MASK", 0x7FFFFFF8)


def ll_flag(step: int) -> int:
    """``NCCL_LL_FLAG(step + 1)``: the flag of the LL transfer at ``step`` (kernel and proxy agree on it)."""
    return (step + 1) % LL_FLAG_MOD

