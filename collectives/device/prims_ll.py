"""The LL protocol (NCCL ``src/device/prims_ll.h``, ``Primitives<..., ProtoLL>``): readiness travels in the data.

A 16-byte line is ``{data1, flag1, data2, flag2}`` carrying 8 data bytes; the flag of step s is
``NCCL_LL_FLAG(s + 1)``, the low 32 bits of ``s + 1``.  There is no tail: the reader accepts a line only when both
flags are current (``readLL``), so a line whose data has not fully arrived, or a stale line of an older step, is
never taken.  Every call moves one step (at most 32 KiB of data with the default 512 KiB ``NCCL_LL_BUFFSIZE``):
the sender takes credit through head (``waitSend``), the receiver returns it by ``head = ++recvStep``
(``postRecv``).  Wrap-around guard (``incSend``): on a step with ``(step & NCCL_LL_CLEAN_MASK) == CLEAN_MASK`` the
sender also writes ``{0, flag}`` into every remaining line of the slot, so that no line keeps a flag old enough to
come round again.  NCCL's test build shrinks both (``NCCL_LL_FLAG(a) = a % 0x100``, mask ``0x78``); here
``NCCLLAB_LL_FLAG_MOD`` and ``NCCLLAB_LL_CLEAN_MASK`` do the same, for the wrap-around tests.
The line loops are numba kernels (``ll_kernels``); the reduction is ``reduce_copy`` on the unpacked words.
Operand order: NCCL's LL computes ``fn(peer, local)``, Simple ``fn(local, peer)``; the built-in ops commute
bitwise, and the association ``(local op p0) op p1`` is the same, so we share ``reduce_copy``.
"""
from __future__ import annotations

import numpy as np

from collectives.include.bitops import div_up
from collectives.include.device import LL_CLEAN_MASK, NCCL_STEPS, ll_flag

from . import ll_kernels as K
from .primitives import Primitives
from .reduce_copy import reduce_copy

class PrimitivesLL(Primitives):
    proto = "LL"

    def __init__(self, kernel, channel, recv, send, sendbuff, recvbuff, op, group: int = 0):
        super().__init__(kernel, channel, recv, send, sendbuff, recvbuff, op, group)
        conn = self.recv_conn or self.send_conn
        self.step_bytes = conn.step_size(self.proto)
        self.max_words = self.max_data_bytes() // 8
        # One unpacked buffer per recv peer, one packed source for all send peers; recv and send staging must
        # not alias: a recv_reduce_send reads one while filling the other.
        self.rbufs = [c.staging(self.proto, self.max_words) for c in self.recv_conns]
        self.rbytes = [b.view(np.uint8) for b in self.rbufs]
        self.sbuf = self.send_conn.staging(self.proto, self.max_words) if self.send_conns else None
        self.sbytes = self.sbuf.view(np.uint8) if self.send_conns else None

    def max_data_bytes(self) -> int:
        return self.step_bytes // 2

    def slot_words(self, conn, step: int) -> np.ndarray:
        return conn.words[self.proto][step % NCCL_STEPS]

    def generic_op(self, src_ix, dst_ix, nelem: int, recv: bool, send: bool, post_op: bool,
                   from_output: bool = False):
        """``LLGenericOp<RECV, SEND, SrcBuf, DstBuf>``: one step per call, even for nelem = 0."""
        nelem = max(nelem, 0)
        nbytes = nelem * self.esize
        if nbytes > self.max_data_bytes():
            raise ValueError(f"{self.proto} call of {nbytes} B exceeds one step ({self.max_data_bytes()} B)")
        dtype = self.input.dtype
        tracing = self.tracer is not None
        step = self.recv_step if recv else self.send_step
        if send:
            yield from self.wait_send_credit(1)
        srcs, dsts = [], []
        if src_ix is not None:
            srcs.append(self.source(src_ix, nelem, from_output))
        if recv:
            for i in range(len(self.recv_conns)):  # readLL from each peer in turn (NCCL: peer 0, then 1, 2)
                yield from self.receive(i, nbytes)
                srcs.append(self.rbytes[i][:nbytes].view(dtype))
            if nbytes:  # an empty LL receive does not wait for the sender: nothing proves it is here yet
                self.first_recv_done()
        if dst_ix is not None:
            dsts.append(self.output[dst_ix:dst_ix + nelem])
        if send:
            nwords = self.padded_words(nbytes)
            if nwords:
                self.sbuf[nbytes // 8:nwords] = 0  # zero the padding of the last unit
            dsts.append(self.sbytes[:nbytes].view(dtype))
        if nelem:
            reduce_copy(self.op, srcs, dsts, pre_op=src_ix is not None and not from_output, post_op=post_op)
        if send:
            for i, conn in enumerate(self.send_conns):
                self.store(i, nbytes)
                self.ring_doorbell(conn)
            self.send_step += 1
        if recv:
            self.recv_step += 1
            self.post_heads()
        self.kernel.progress += 1
        if tracing:
            base = src_ix if src_ix is not None else dst_ix
            self.trace_step(recv, send, 0, step, base or 0, nelem, nbytes, self.t_mark)

    # --- LL specifics (LL128 overrides these) ---
    def padded_words(self, nbytes: int) -> int:
        return div_up(nbytes, 8)

    def receive(self, i: int, nbytes: int):
        """``readLL`` over every line from recv peer ``i``, resumable: yields until all carry the current flag."""
        conn, nlines = self.recv_conns[i], div_up(nbytes, 8)
        step = self.recv_step + self.recv_pairs[i][1]
        words, flag, rbuf = self.slot_words(conn, step), ll_flag(step), self.rbufs[i]
        done = 0
        while True:
            done = K.ll_poll_unpack(words, rbuf, done, nlines, flag)
            if done == nlines:
                return
            self.kernel.waiting(self, "LL flag", conn.peer, step, conn.doorbell, conn.tail_sleep)
            yield

    def store(self, i: int, nbytes: int) -> None:
        """``storeLL`` of every line to send peer ``i``, then the cleanup of ``incSend`` on clean-mask steps.  A
        proxied connection learns the size from ``connFifo`` (the whole step on a clean step) and waits for the
        lines' flags."""
        conn, nlines = self.send_conns[i], div_up(nbytes, 8)
        step = self.send_step + self.send_pairs[i][1]
        words, flag = self.slot_words(conn, step), ll_flag(step)
        clean = (step & LL_CLEAN_MASK) == LL_CLEAN_MASK
        if conn.conn_fifo is not None:
            conn.conn_fifo[step % NCCL_STEPS] = self.step_bytes if clean else nlines * 16
        K.ll_pack(words, self.sbuf, nlines, flag)
        if clean:
            K.ll_fill(words, nlines, self.step_bytes // 16, flag)
