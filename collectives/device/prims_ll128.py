"""The LL128 protocol (NCCL ``src/device/prims_ll128.h``, ``Primitives<..., ProtoLL128>``).

A 128-byte line is 16 words: 15 data words and, in word 15, the flag ``step + 1`` as a full 64-bit value.
Data moves in "wire slices" of 16 lines (2048 B) that carry 1920 data bytes, with the intra-slice layout of
NCCL's warp registers (``ll_kernels.LL128_PERM``).  A call moves one step (at most 576,000 data bytes with the
default 4,915,200-byte ``NCCL_LL128_BUFFSIZE``) and writes whole slices, zero-padded.  The reader accepts a slice
when all 16 of its lines carry the current flag.  Over SHM there is no tail (flags only), as in NCCL for
connections without a proxy.

How the CPU keeps NCCL's guarantee that a reader never sees a flag without its data: the sender stores all data
words (``ll128_pack``) and only then, in a separate call, the flag words (``ll128_set_flags``); x86 makes the
stores visible in that order.  The reader loads flags (``ll128_ready``) and only afterwards, in a separate call,
the data (``ll128_unpack``); x86 does not reorder loads.
"""
from __future__ import annotations

import numpy as np

from collectives.include.bitops import div_up
from collectives.include.device import NCCL_STEPS

from . import ll_kernels as K
from .prims_ll import PrimitivesLL

SLICE_DATA = 1920   # bytes of data per 2048-byte wire slice


class PrimitivesLL128(PrimitivesLL):
    proto = "LL128"

    def max_data_bytes(self) -> int:
        return self.step_bytes // 2048 * SLICE_DATA

    def padded_words(self, nbytes: int) -> int:
        return div_up(nbytes, SLICE_DATA) * K.LL128_DATA_WORDS

    def receive(self, i: int, nbytes: int):
        conn, nslices = self.recv_conns[i], div_up(nbytes, SLICE_DATA)
        step = self.recv_step + self.recv_pairs[i][1]
        wire, flag, rbuf = self.slot_words(conn, step), np.uint64(step + 1), self.rbufs[i]
        ready, unpacked = 0, 0
        while True:
            ready = K.ll128_ready(wire, ready, nslices * 16, flag)
            full = ready // 16
            if full > unpacked:
                K.ll128_unpack(wire, rbuf, unpacked, full, K.LL128_PERM)
                unpacked = full
            if unpacked == nslices:
                return
            self.kernel.waiting(self, "LL128 flag", conn.peer, step, conn.doorbell, conn.tail_sleep)
            yield

    def store(self, i: int, nbytes: int) -> None:
        nslices = div_up(nbytes, SLICE_DATA)
        conn = self.send_conns[i]
        step = self.send_step + self.send_pairs[i][1]
        wire = self.slot_words(conn, step)
        if conn.conn_fifo is not None:
            conn.conn_fifo[step % NCCL_STEPS] = nslices * 2048
        K.ll128_pack(wire, self.sbuf, nslices, K.LL128_PERM)
        K.ll128_set_flags(wire, nslices * 16, np.uint64(step + 1))
        if conn.conn_fifo is not None:  # proxied: also publish tail (NCCL: fence, then tail += 1)
            conn.tail[0] = step + 1
