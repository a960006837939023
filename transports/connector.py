"""The device view of one connection (NCCL ``struct ncclConnInfo``, ``src/include/device.h``).

``head`` lives in the sender's ``ncclSendMem`` and counts steps the receiver has freed; ``tail`` and the FIFO
live in the receiver's ``ncclRecvMem`` and ``tail`` counts steps the sender has filled.  ``step`` is the
connection's persistent step counter: it survives from one collective to the next (``conn->step``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collectives.param import NCCL_STEPS

# Byte layout of the two memory objects (ncclSendMem / ncclRecvMem): each counter on its own 128-B line.
SENDMEM_BYTES = 4096
RECVMEM_BYTES = 4096
HEAD_OFFSET = 0
TAIL_OFFSET = 0
SLEEP_OFFSET = 64  # uint32 "a waiter sleeps on this counter" mark, on the next 64-B line of the counter's 128 B


@dataclass
class Connector:
    peer: int                 # the rank at the other end
    is_send: bool
    buff: np.ndarray          # Simple FIFO (uint8), NCCL_STEPS slots of step_size bytes, in the receiver's memory
    head: np.ndarray          # uint64[1] in the sender's memory
    tail: np.ndarray          # uint64[1] in the receiver's memory
    step_size: int            # bytes per FIFO slot: buffSizes[Simple] / NCCL_STEPS
    head_sleep: np.ndarray | None = None   # uint32[1]: the sender sleeps on head
    tail_sleep: np.ndarray | None = None   # uint32[1]: the receiver sleeps on tail
    transport: str = "SHM"
    step: int = 0             # persistent step counter (conn->step)

    def slot(self, step: int, nbytes: int) -> np.ndarray:
        """Bytes of FIFO slot ``step % NCCL_STEPS`` (a slice may span StepPerSlice consecutive slots)."""
        start = (step % NCCL_STEPS) * self.step_size
        return self.buff[start:start + nbytes]
