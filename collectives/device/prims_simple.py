"""The Simple protocol (NCCL ``src/device/prims_simple.h``, ``Primitives<..., ProtoSimple<SlicePerChunk,
StepPerSlice>>``).

Each call cuts its chunk into ``SlicePerChunk`` slices; each slice occupies ``StepPerSlice`` consecutive FIFO steps,
and per slice:

1. ``waitPeer``: the receiver waits for ``tail >= step + StepPerSlice``; the sender waits for credit,
   ``head + NCCL_STEPS >= step + StepPerSlice`` (at most 8 steps in flight).
2. ``reduceCopy`` of the slice between the user buffers and the FIFO slots.
3. ``postPeer``: ``step += StepPerSlice``, then the sender stores ``step`` into the peer's tail *after* its data,
   and the receiver stores it into ``head``.

Empty trailing slices still wait and post, so each call advances the step by exactly SlicePerChunk*StepPerSlice.
At construction each side rounds ``conn.step`` up to that multiple, and the receiver returns the skipped credit
at once by writing ``head``.

``NetRegMode`` (registered user buffers on a NET connection, ``collectives/register.py``; ``waitPeer``'s pointer
choice): the proxy has received the peer's slice straight into the output, at the chunk's own offset, so the
kernel reads it there; what goes to a NET peer is left in the output (or, for a loop's first send, in the input)
for the proxy to send from there.  No FIFO slot of that connection is touched; a copy of the output onto itself
is skipped.  The receiver marks ``connFifo`` at construction so that its proxy knows the call has started.
"""
from __future__ import annotations

from collectives.include.bitops import div_up
from collectives.include.device import NCCL_STEPS

from .primitives import Primitives
from .reduce_copy import reduce_copy


class PrimitivesSimple(Primitives):
    proto = "Simple"

    def __init__(self, kernel, channel, recv, send, sendbuff, recvbuff, op, slice_per_chunk: int,
                 step_per_slice: int, group: int = 0, net_reg: bool = False):
        super().__init__(kernel, channel, recv, send, sendbuff, recvbuff, op, group,
                         chunk_steps=slice_per_chunk * step_per_slice)
        self.spc, self.sps = slice_per_chunk, step_per_slice
        conn = self.recv_conn or self.send_conn
        self.step_elems = conn.step_size(self.proto) // self.esize
        # NetRegMode per peer: a NET connection (it has a proxy) of a call with registered buffers
        self.recv_reg = [net_reg and c.proxy_conn is not None for c, _ in self.recv_pairs]
        self.send_reg = [net_reg and c.proxy_conn is not None for c, _ in self.send_pairs]
        for (rconn, delta), reg in zip(self.recv_pairs, self.recv_reg):
            if reg:  # the kernel has started: the proxy may write into the user's buffer (regBufferReady)
                rconn.conn_fifo[(self.recv_step + delta) % NCCL_STEPS] = 0
        if self.recv_pairs:
            self.post_heads()  # return the credit of the steps we skipped

    def generic_op(self, src_ix, dst_ix, nelem: int, recv: bool, send: bool, post_op: bool,
                   from_output: bool = False):
        """``genericOp<DirectRecv, DirectSend, Recv, Send, Src, Dst>``."""
        kernel, spc, sps = self.kernel, self.spc, self.sps
        nelem = max(nelem, 0)
        slice_size = max(div_up(nelem, 16 * spc) * 16, self.step_elems * sps // 32)
        esize, dtype, offset = self.esize, self.input.dtype, 0
        tracing = self.tracer is not None
        for slice_ix in range(spc):
            real = max(0, min(slice_size, nelem - offset))
            step = self.recv_step if recv else self.send_step
            if recv:  # waitPeer: every recv peer has filled this slice
                for rconn, delta in self.recv_pairs:
                    target = self.recv_step + delta + sps
                    while int(rconn.tail[0]) < target:
                        kernel.waiting(self, "tail", rconn.peer, self.recv_step + delta, rconn.tail,
                                       rconn.tail_sleep)
                        yield
                self.first_recv_done()
            if send:  # ... and every send peer has room for it
                yield from self.wait_send_credit(sps)
                for sconn, delta in self.send_pairs:
                    if sconn.conn_fifo is not None:  # a proxy sends this slice: tell it the size
                        sconn.conn_fifo[(self.send_step + delta) % NCCL_STEPS] = real * esize
            if real:
                nbytes = real * esize
                srcs, dsts = [], []
                at = (src_ix if src_ix is not None else dst_ix) + offset  # NetRegMode: the chunk in the output
                if src_ix is not None:
                    srcs.append(self.source(src_ix + offset, real, from_output))
                in_output = recv and src_ix is None and all(self.recv_reg)  # the data already sits at ``at``
                if recv:
                    for (rconn, delta), reg in zip(self.recv_pairs, self.recv_reg):
                        srcs.append(self.output[at:at + real] if reg else
                                    rconn.slot(self.proto, self.recv_step + delta, nbytes).view(dtype))
                if (dst_ix is not None or (recv and send and any(self.send_reg))) and not in_output:
                    dsts.append(self.output[at:at + real] if dst_ix is None else
                                self.output[dst_ix + offset:dst_ix + offset + real])
                if send:
                    for (sconn, delta), reg in zip(self.send_pairs, self.send_reg):
                        if not reg:  # a registered send goes from the output (or the input) itself
                            dsts.append(sconn.slot(self.proto, self.send_step + delta, nbytes).view(dtype))
                if dsts:
                    reduce_copy(self.op, srcs, dsts, pre_op=src_ix is not None and not from_output,
                                post_op=post_op)
            if recv:
                self.recv_step += sps
                self.post_heads()
            if send:
                self.send_step += sps
                self.post_tails()
            kernel.progress += 1
            if tracing:
                base = src_ix if src_ix is not None else dst_ix
                self.trace_step(recv, send, slice_ix, step, (base or 0) + offset, real, real * esize, self.t_mark)
            offset += slice_size
