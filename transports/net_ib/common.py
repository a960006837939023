"""The IB plugin's shared structures and limits (NCCL ``src/transport/net_ib/common.h``).

``SEND_FIFO`` is ``struct ncclIbSendFifo``, the clear-to-send entry the receiver RDMA-writes into the sender's
CTS FIFO: ``{addr, size, rkeys[NCCL_IB_MAX_DEVS_PER_NIC], nreqs, tag, idx}``, 64 bytes, so an entry is one
aligned unit that cannot land torn.  The FIFO has ``NET_IB_MAX_REQUESTS`` (256) slots of ``NCCL_NET_IB_MAX_RECVS``
entries.
"""
from __future__ import annotations

import numpy as np

NCCL_NET_MAX_REQUESTS = 32
NCCL_NET_IB_MAX_RECVS = 8
NET_IB_MAX_REQUESTS = NCCL_NET_MAX_REQUESTS * NCCL_NET_IB_MAX_RECVS  # 256
NCCL_IB_MAX_DEVS_PER_NIC = 8
NCCL_IB_MAX_QPS = 128
IB_WRITE_CHUNK_ALIGNMENT = 128  # split chunks stay 128-B aligned (LL/LL128 lines must not straddle QPs)

SEND_FIFO = np.dtype([("addr", "<u8"), ("size", "<u8"), ("rkeys", "<u4", (NCCL_IB_MAX_DEVS_PER_NIC,)),
                      ("nreqs", "<u4"), ("tag", "<u4"), ("idx", "<u8")])
assert SEND_FIFO.itemsize == 64

REQ_UNUSED, REQ_SEND, REQ_RECV = 0, 1, 2
PAGE = 4096


def aligned_zeros(shape: tuple, dtype) -> np.ndarray:
    """Page-aligned zeroed array (NCCL allocates comms with ``ncclIbMalloc``, page-aligned): a FIFO entry must
    start on a 64-B boundary or a NIC may place its two halves, and ``idx`` with them, in either order."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.zeros(nbytes + PAGE, np.uint8)
    off = (-raw.ctypes.data) % PAGE
    return raw[off:off + nbytes].view(dtype).reshape(shape)


class IbRequest:
    """``struct ncclIbRequest``: ``events`` counts the completions still expected (one per QP used)."""
    __slots__ = ("comm", "id", "type", "nreqs", "events", "size", "addr", "lkey", "slot", "t_post")

    def __init__(self, comm, rid: int, rtype: int, nreqs: int):
        self.comm, self.id, self.type, self.nreqs = comm, rid, rtype, nreqs
        self.events = 0
        self.size = self.addr = self.lkey = 0
        self.slot = rid % NET_IB_MAX_REQUESTS
        self.t_post = 0


def htobe32(x: int) -> int:
    """The immediate carries the size in network order (NCCL's ``htobe32``); the wire keeps the 32 bits as is."""
    return int.from_bytes(int(x & 0xFFFFFFFF).to_bytes(4, "big"), "little")


be32toh = htobe32
