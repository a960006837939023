"""Memory regions (pyverbs ``pyverbs.mr.MR``) of the software verbs provider.

Registration gives an lkey and a different rkey (catching one used for the other) and records the access flags;
the wire thread checks them on every remote write.  As in verbs, remote write access needs local write.
"""
from __future__ import annotations

import ctypes

import numpy as np

from . import enums as e
from .device import PD
from .error import SimVerbsError


class MR:
    def __init__(self, creator: PD, length: int, access: int, address: int | None = None, **_kw):
        if access & (e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_ATOMIC) and not access & e.IBV_ACCESS_LOCAL_WRITE:
            raise SimVerbsError("Failed to register a MR: remote write access needs local write (EINVAL)")
        if length < 0:
            raise SimVerbsError("Failed to register a MR: negative length (EINVAL)")
        self._mem = None
        if address is None:  # pyverbs allocates the buffer itself when given no address
            self._mem = np.zeros(max(length, 1), np.uint8)
            address = self._mem.ctypes.data
        self.pd, self.buf, self.length, self.access = creator, address, length, access
        self.lkey, self.rkey = creator.hca.register_mr(self)

    def covers(self, addr: int, length: int) -> bool:
        return self.buf <= addr and addr + length <= self.buf + self.length

    def read(self, length: int, offset: int) -> bytes:
        if not self.covers(self.buf + offset, length):
            raise SimVerbsError("MR read out of bounds")
        return ctypes.string_at(self.buf + offset, length)

    def write(self, data, length: int, offset: int = 0) -> None:
        if not self.covers(self.buf + offset, length):
            raise SimVerbsError("MR write out of bounds")
        ctypes.memmove(self.buf + offset, bytes(data)[:length], length)

    def close(self) -> None:
        if self.lkey is not None:
            self.pd.hca.deregister_mr(self)
            self.lkey = self.rkey = None
