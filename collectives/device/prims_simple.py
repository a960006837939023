"""The Simple protocol's primitives (NCCL ``src/device/prims_simple.h``, ``Primitives<T, RedOp, Fan,
Direct, ProtoSimple<SlicePerChunk, StepPerSlice>>``).

Every primitive call (``send``, ``recv_reduce_send``, ...) is ``generic_op``: the chunk is cut into
``SlicePerChunk`` slices, each slice occupies ``StepPerSlice`` consecutive FIFO steps, and per slice:

1. ``waitPeer``: the receiver waits for ``tail >= step + StepPerSlice``; the sender waits for credit,
   ``head + NCCL_STEPS >= step + StepPerSlice`` (at most 8 steps in flight).
2. ``reduceCopy`` of the slice between the user buffers and the FIFO slots.
3. ``postPeer``: ``step += StepPerSlice``, then the sender stores ``step`` into the peer's tail *after* its data
   (x86 keeps stores in order, NCCL needs ``fence_acq_rel_sys``), and the receiver stores it into ``head``.

Empty trailing slices still wait and post, so each call advances the step by exactly SlicePerChunk*StepPerSlice.
At construction each side rounds ``conn.step`` up to that multiple, and the receiver returns the skipped credit
at once by writing ``head``; at destruction (``finish``) the step is saved back into the connector.
Waits are generator yields, so one process steps all its channels (CUDA blocks) in turn.
Deliberate difference: direct (registered-buffer) modes are not modelled; all data goes through the FIFO, which is
what NCCL does for unregistered buffers.
"""
from __future__ import annotations

import numpy as np

from collectives.param import NCCL_STEPS
from transports.connector import Connector

from . import futex
from .reduce_copy import RedOp, reduce_copy


def _div_up(a: int, b: int) -> int:
    return (a + b - 1) // b


class PrimitivesSimple:
    def __init__(self, kernel, channel: int, recv: Connector | None, send: Connector | None,
                 sendbuff: np.ndarray, recvbuff: np.ndarray, op: RedOp,
                 slice_per_chunk: int, step_per_slice: int):
        self.kernel, self.channel = kernel, channel
        self.recv_conn, self.send_conn = recv, send
        self.input, self.output, self.op = sendbuff, recvbuff, op
        self.spc, self.sps = slice_per_chunk, step_per_slice
        self.esize = sendbuff.dtype.itemsize
        chunk_steps = slice_per_chunk * step_per_slice
        self.step_elems = (recv or send).step_size // self.esize if (recv or send) else 0
        if recv is not None:
            self.recv_step = _div_up(recv.step, chunk_steps) * chunk_steps
            self._head_addr = futex.address(recv.head)
            self._post_head(self.recv_step)  # return the credit of the steps we skipped
        if send is not None:
            self.send_step = _div_up(send.step, chunk_steps) * chunk_steps
            self._tail_addr = futex.address(send.tail)
        self._checked_prev = False

    def _post_head(self, step: int) -> None:
        conn = self.recv_conn
        conn.head[0] = step
        if conn.head_sleep[0]:  # the sender sleeps on head (oversubscribed host)
            futex.wake(self._head_addr)

    def _post_tail(self, step: int) -> None:
        conn = self.send_conn
        conn.tail[0] = step  # after the data: x86 keeps stores in order
        if conn.tail_sleep[0]:
            futex.wake(self._tail_addr)

    def finish(self) -> None:
        """Destructor: save the step counters into the connectors for the next collective."""
        if self.recv_conn is not None:
            self.recv_conn.step = self.recv_step
        if self.send_conn is not None:
            self.send_conn.step = self.send_step

    # --- the primitive names NCCL uses (Direct variants map to the plain ones: no registered buffers) ---
    def send(self, inp: int, nelem: int):
        return self.generic_op(inp, None, nelem, recv=False, send=True, post_op=False)

    def copy_send(self, inp: int, out: int, nelem: int):
        return self.generic_op(inp, out, nelem, recv=False, send=True, post_op=False)

    def recv(self, out: int, nelem: int):
        return self.generic_op(None, out, nelem, recv=True, send=False, post_op=False)

    def recv_reduce_send(self, inp: int, nelem: int):
        return self.generic_op(inp, None, nelem, recv=True, send=True, post_op=False)

    def recv_reduce_copy(self, inp: int, out: int, nelem: int, post_op: bool = False):
        return self.generic_op(inp, out, nelem, recv=True, send=False, post_op=post_op)

    def recv_reduce_copy_send(self, inp: int, out: int, nelem: int, post_op: bool = False):
        return self.generic_op(inp, out, nelem, recv=True, send=True, post_op=post_op)

    def recv_copy_send(self, out: int, nelem: int):
        return self.generic_op(None, out, nelem, recv=True, send=True, post_op=False)

    def generic_op(self, src_ix, dst_ix, nelem: int, recv: bool, send: bool, post_op: bool):
        """``genericOp<DirectRecv, DirectSend, Recv, Send, Src, Dst>``, as a generator that yields while waiting."""
        kernel, spc, sps = self.kernel, self.spc, self.sps
        nelem = max(nelem, 0)
        slice_size = max(_div_up(nelem, 16 * spc) * 16, self.step_elems * sps // 32)
        esize, offset = self.esize, 0
        rconn, sconn = self.recv_conn, self.send_conn
        for _ in range(spc):
            real = max(0, min(slice_size, nelem - offset))
            if recv:
                target = self.recv_step + sps
                while int(rconn.tail[0]) < target:
                    kernel.waiting(self.channel, "tail", rconn.peer, self.recv_step, rconn.tail, rconn.tail_sleep)
                    yield
                if not self._checked_prev:
                    kernel.check_peer_op(rconn.peer)
                    self._checked_prev = True
            if send:
                target = self.send_step + sps
                while int(sconn.head[0]) + NCCL_STEPS < target:
                    kernel.waiting(self.channel, "head", sconn.peer, self.send_step, sconn.head, sconn.head_sleep)
                    yield
            if real:
                nbytes = real * esize
                srcs, dsts = [], []
                if src_ix is not None:
                    srcs.append(self.input[src_ix + offset:src_ix + offset + real])
                if recv:
                    srcs.append(rconn.slot(self.recv_step, nbytes).view(self.input.dtype))
                if dst_ix is not None:
                    dsts.append(self.output[dst_ix + offset:dst_ix + offset + real])
                if send:
                    dsts.append(sconn.slot(self.send_step, nbytes).view(self.input.dtype))
                reduce_copy(self.op, srcs, dsts, pre_op=src_ix is not None, post_op=post_op)
            if recv:
                self.recv_step += sps
                self._post_head(self.recv_step)  # postRecv: free the slots
            if send:
                self.send_step += sps
                self._post_tail(self.send_step)  # postSend: data first, then tail
            kernel.progress += 1
            offset += slice_size
