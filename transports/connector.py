"""The device view of one connection (NCCL ``struct ncclConnInfo``, ``src/include/device.h``).

``head`` lives in the sender's ``ncclSendMem`` and counts steps the receiver has freed; ``tail`` and the FIFOs
live in the receiver's ``ncclRecvMem`` and ``tail`` counts steps the sender has filled (Simple only: LL and LL128
carry readiness in their flags).  ``buffs[proto]`` is each protocol's FIFO of NCCL_STEPS slots.  ``step`` is the
connection's persistent step counter, shared by the protocols: it survives from one collective to the next.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collectives.param import NCCL_STEPS

PROTOS = ("LL", "LL128", "Simple")  # NCCL_PROTO_LL=0, NCCL_PROTO_LL128=1, NCCL_PROTO_SIMPLE=2
# Byte layout of the two memory objects (ncclSendMem / ncclRecvMem): each counter on its own 128-B line.
SENDMEM_BYTES = 4096
RECVMEM_BYTES = 4096
HEAD_OFFSET = 0
TAIL_OFFSET = 0
SLEEP_OFFSET = 64     # uint32 "a waiter sleeps on this line" mark (ours: futex sleeping, see device/futex.py)
DOORBELL_OFFSET = 128  # uint32 bumped by an LL/LL128 sender when its reader sleeps (ours, same reason)


def recv_layout(buff_sizes: dict) -> tuple[dict, int]:
    """Offsets of the LL, LL128 and Simple FIFOs after ncclRecvMem, and the total size."""
    offsets, off = {}, RECVMEM_BYTES
    for p in PROTOS:
        offsets[p] = off
        off += buff_sizes[p]
    return offsets, off


@dataclass
class Connector:
    peer: int                  # the rank at the other end
    is_send: bool
    buffs: dict                # proto -> uint8 FIFO in the receiver's memory
    head: np.ndarray           # uint64[1] in the sender's memory
    tail: np.ndarray           # uint64[1] in the receiver's memory
    head_sleep: np.ndarray     # uint32[1]: the sender sleeps on head
    tail_sleep: np.ndarray     # uint32[1]: the receiver sleeps on tail (Simple) or the doorbell (LL, LL128)
    doorbell: np.ndarray       # uint32[1] in the receiver's memory
    transport: str = "SHM"
    step: int = 0              # persistent step counter (conn->step)

    def step_size(self, proto: str) -> int:
        """Bytes per FIFO slot: buffSizes[proto] / NCCL_STEPS."""
        return len(self.buffs[proto]) // NCCL_STEPS

    def slot(self, proto: str, step: int, nbytes: int) -> np.ndarray:
        """Bytes of FIFO slot ``step % NCCL_STEPS`` (a Simple slice may span StepPerSlice consecutive slots)."""
        size = len(self.buffs[proto]) // NCCL_STEPS
        start = (step % NCCL_STEPS) * size
        return self.buffs[proto][start:start + nbytes]
