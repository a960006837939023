"""The device view of one connection (NCCL ``struct ncclConnInfo``, ``src/include/device.h``).

``head`` lives in the sender's ``ncclSendMem`` and counts steps the receiver has freed; ``tail`` and the FIFOs
live in the receiver's ``ncclRecvMem`` and ``tail`` counts steps the sender has filled (Simple only: LL and LL128
carry readiness in their flags).  ``buffs[proto]`` is each protocol's FIFO of NCCL_STEPS slots.  ``step`` is the
connection's persistent step counter, shared by the protocols: it survives from one collective to the next.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from collectives.misc.futex import address

from .device import NCCL_STEPS
from .protocols import PROTOCOLS, PROTOS

# Byte layout of the two memory objects (ncclSendMem / ncclRecvMem): each counter on its own 128-B line.
SENDMEM_BYTES = 4096
RECVMEM_BYTES = 4096
HEAD_OFFSET = 0
TAIL_OFFSET = 0
SLEEP_OFFSET = 64     # uint32 "a waiter sleeps on this line" mark (ours: futex sleeping, see collectives/misc/futex.py)
DOORBELL_OFFSET = 128  # uint32 bumped by an LL/LL128 sender when its reader sleeps (ours, same reason)


def slot_bytes(proto: str, buff_size: int) -> int:
    """Bytes per FIFO slot as the device code strides them: ``buffSizes[p] / NCCL_STEPS`` in whole units, so any
    ``NCCL_*BUFFSIZE`` works (NCCL accepts any value)."""
    unit = PROTOCOLS[proto].slot_unit  # LL lines (stepLines), LL128 64-bit words (stepSize), Simple 8-byte words
    return buff_size // NCCL_STEPS // unit * unit


def recv_layout(buff_sizes: dict) -> tuple[dict, int]:
    """Offsets of the LL, LL128 and Simple FIFOs after ncclRecvMem (each 128-byte aligned), and the total size."""
    offsets, off = {}, RECVMEM_BYTES
    for p in PROTOS:
        offsets[p] = off
        off += -(-buff_sizes[p] // 128) * 128
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
    conn_fifo: np.ndarray | None = None  # int64[NCCL_STEPS] step sizes for a proxy (NET); None over SHM
    proxy_conn: object = None  # NET: the proxy's NetConnection for this connector (ncclConnector::proxyConn)
    words: dict = field(init=False)      # proto -> uint64[NCCL_STEPS, slot words]: each slot as 64-bit words
    scratch: dict = field(init=False)    # proto -> reusable uint64 staging (LL/LL128 pack and unpack)
    step_word: np.ndarray = field(init=False)  # int64[1]: the persistent step counter (conn->step), as memory so
                                               # that compiled code (``ll_compiled``) reads and saves it too
    head_addr: int = field(init=False)   # addresses for futex sleeping and waking
    tail_addr: int = field(init=False)
    bell_addr: int = field(init=False)

    def __post_init__(self) -> None:
        self.words = {p: b[:NCCL_STEPS * slot_bytes(p, len(b))].view(np.uint64).reshape(NCCL_STEPS, -1)
                      for p, b in self.buffs.items()}
        self.scratch = {}
        self.step_word = np.zeros(1, np.int64)
        self.head_addr, self.tail_addr, self.bell_addr = address(self.head), address(self.tail), address(self.doorbell)

    @property
    def step(self) -> int:
        """The connection's step counter: it survives from one collective to the next."""
        return int(self.step_word[0])

    @step.setter
    def step(self, value: int) -> None:
        self.step_word[0] = value

    def staging(self, proto: str, nwords: int) -> np.ndarray:
        """A uint64 buffer of at least ``nwords``, kept for the connection's lifetime (no per-call allocation)."""
        buf = self.scratch.get(proto)
        if buf is None or len(buf) < nwords:
            buf = self.scratch[proto] = np.zeros(nwords, np.uint64)
        return buf

    def step_size(self, proto: str) -> int:
        """Bytes per FIFO slot (``slot_bytes``)."""
        return slot_bytes(proto, len(self.buffs[proto]))

    def slot(self, proto: str, step: int, nbytes: int) -> np.ndarray:
        """Bytes of FIFO slot ``step % NCCL_STEPS`` (a Simple slice may span StepPerSlice consecutive slots)."""
        start = (step % NCCL_STEPS) * slot_bytes(proto, len(self.buffs[proto]))
        return self.buffs[proto][start:start + nbytes]
