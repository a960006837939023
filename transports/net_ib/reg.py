"""Memory registration with a cache (NCCL ``src/transport/net_ib/reg.cc``: ``ncclIbRegMrDmaBufInternal``, the
``ncclIbMrCache``).

Registrations are page-aligned and cached by address range, so registering inside an already registered range
returns the cached MR and counts one more reference; ``dereg`` (``ncclIbDeregMr``) drops one and deregisters the
MR with the last.  Where we differ: our NET proxy hands the plugin slices of its FIFO buffers without calling
``regMr`` first, so ``lookup`` registers the whole buffer a slice belongs to on first use (held until the comm
closes, not counted); and the cache belongs to a comm (freed when it closes) rather than to a device.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAGE = 4096


def address_of(buf: memoryview) -> int:
    return np.frombuffer(buf, np.uint8).ctypes.data if len(buf) else 0


@dataclass
class Entry:
    """One cached registration: its pages, the MR, the object that keeps the memory alive while registered, and
    how many ``reg`` calls hold it (``refs``)."""
    start: int
    end: int
    mr: object
    owner: object
    refs: int = 1


class MrCache:
    def __init__(self, V, pd):
        self.V, self.pd = V, pd
        self.entries: list[Entry] = []

    def reg(self, addr: int, size: int, owner=None):
        """-> the MR covering [addr, addr + size), registering its pages if none does; one reference more."""
        entry = self._find(addr, size)
        if entry is not None:
            entry.refs += 1
            return entry.mr
        e = self.V.e
        start = addr & -PAGE
        end = -(-(addr + max(size, 1)) // PAGE) * PAGE
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        mr = self.V.MR(self.pd, end - start, access, address=start)
        self.entries.append(Entry(start, end, mr, owner))
        return mr

    def _find(self, addr: int, size: int) -> Entry | None:
        for entry in self.entries:
            if entry.start <= addr and addr + size <= entry.end:
                return entry
        return None

    def dereg(self, mr) -> None:
        """One reference of ``mr`` fewer; the last deregisters it.  An MR this cache does not hold is an error."""
        for entry in self.entries:
            if entry.mr is mr:
                entry.refs -= 1
                if entry.refs == 0:
                    mr.close()
                    self.entries = [x for x in self.entries if x is not entry]
                return
        raise ValueError("dereg_mr: this memory region is not registered on this connection")

    def lookup(self, buf: memoryview):
        """The MR for a slice of a buffer (registering the whole underlying buffer the first time)."""
        base = buf.obj if buf.obj is not None else buf
        whole = memoryview(base.reshape(-1) if isinstance(base, np.ndarray) else base).cast("B")
        entry = self._find(address_of(whole), len(whole))  # found: not one more reference (the comm holds it)
        return entry.mr if entry is not None else self.reg(address_of(whole), len(whole), owner=base)

    def close(self) -> None:
        for entry in self.entries:
            entry.mr.close()
        self.entries = []
