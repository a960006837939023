"""Completion queues (pyverbs ``pyverbs.cq``: ``CQ``, ``WC``) of the software verbs provider.

A CQ is a locked deque the wire thread appends to.  Polling a send completion frees its send-queue slot and
those of the unsignaled WRs posted before it on that QP (verbs' rule for ``sq_sig_all = 0``).  More entries
than ``cqe`` is an overrun: the next poll raises.
"""
from __future__ import annotations

import collections
import threading

from .error import SimVerbsError


class WC:
    __slots__ = ("wr_id", "status", "opcode", "vendor_err", "byte_len", "qp_num", "src_qp", "imm_data", "wc_flags",
                 "pkey_index", "slid", "sl", "dlid_path_bits", "_qp", "_seq")

    def __init__(self, wr_id: int, status: int, opcode: int, qp_num: int, byte_len: int = 0, imm_data: int = 0,
                 wc_flags: int = 0, src_qp: int = 0, qp=None, seq: int = -1):
        self.wr_id, self.status, self.opcode, self.qp_num = wr_id, status, opcode, qp_num
        self.byte_len, self.imm_data, self.wc_flags, self.src_qp = byte_len, imm_data, wc_flags, src_qp
        self.vendor_err = self.pkey_index = self.slid = self.sl = self.dlid_path_bits = 0
        self._qp, self._seq = qp, seq


class CQ:
    """``context``: the device's ``Context`` (the stand-in keeps one queue per CQ, whatever the device)."""

    def __init__(self, context, cqe: int, cq_context=None, channel=None, comp_vector: int = 0):
        self.cqe = cqe
        self._q: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._overrun = False

    def push(self, wc: WC) -> None:
        with self._lock:
            if len(self._q) >= self.cqe:
                self._overrun = True
                return
            self._q.append(wc)

    def poll(self, num_entries: int = 1) -> tuple[int, list]:
        with self._lock:
            if self._overrun:
                raise SimVerbsError(f"CQ overrun: more than {self.cqe} completions were not polled")
            out = [self._q.popleft() for _ in range(min(num_entries, len(self._q)))]
        for wc in out:
            if wc._qp is not None:
                wc._qp.retire_send(wc._seq)
        return len(out), out

    def close(self) -> None:
        pass
