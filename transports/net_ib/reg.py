"""Memory registration with a cache (NCCL ``src/transport/net_ib/reg.cc``: ``ncclIbRegMrDmaBufInternal``, the
``ncclIbMrCache``).

Registrations are page-aligned and cached by address range, so registering inside an already registered range
returns the cached MR.  Where we differ: our NET proxy hands the plugin slices of its FIFO buffers without
calling ``regMr`` first, so ``lookup`` registers the whole buffer a slice belongs to on first use; and the
cache belongs to a comm (freed when it closes) rather than to a device with reference counts.
"""
from __future__ import annotations

import numpy as np

PAGE = 4096


def address_of(buf: memoryview) -> int:
    return np.frombuffer(buf, np.uint8).ctypes.data if len(buf) else 0


class MrCache:
    def __init__(self, V, pd):
        self.V, self.pd = V, pd
        self.entries: list = []   # (start, end, mr, owner)

    def reg(self, addr: int, size: int, owner=None):
        """-> the MR covering [addr, addr + size), registering its pages if none does."""
        for start, end, mr, _ in self.entries:
            if start <= addr and addr + size <= end:
                return mr
        e = self.V.e
        start = addr & -PAGE
        end = -(-(addr + max(size, 1)) // PAGE) * PAGE
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        mr = self.V.MR(self.pd, end - start, access, address=start)
        self.entries.append((start, end, mr, owner))  # owner keeps the memory alive while registered
        return mr

    def lookup(self, buf: memoryview):
        """The MR for a slice of a buffer (registering the whole underlying buffer the first time)."""
        base = buf.obj if buf.obj is not None else buf
        whole = memoryview(base.reshape(-1) if isinstance(base, np.ndarray) else base).cast("B")
        return self.reg(address_of(whole), len(whole), owner=base)

    def close(self) -> None:
        for _, _, mr, _ in self.entries:
            mr.close()
        self.entries = []
