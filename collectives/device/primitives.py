"""The primitives every algorithm calls (NCCL ``src/device/primitives.h``: ``class Primitives``).

``send``, ``recv``, ``recv_reduce_send``, ``recv_reduce_copy``, ``recv_reduce_copy_send``, ``recv_copy_send`` and
``copy_send`` are all one ``generic_op(src, dst, nelem, recv, send, post_op)`` of the protocol (``prims_simple``,
``prims_ll``, ``prims_ll128``).  Like NCCL's ``Fan`` template argument, a primitives object may receive from several
peers and send to several (``FanAsymmetric<3, 1>`` for a tree's reduce, ``<1, 3>`` for its broadcast): the reduction
takes ``[local input, recv peer 0, 1, 2]`` in that order and the result goes to every send peer.  Each connection
keeps its own step counter (a ring and a tree may share a connector); inside one primitives object all of them
advance together, so we keep peer 0's step and each other peer's fixed offset from it.  NCCL's ``direct*``
variants map to the plain ones, as ``PrimitivesWithoutDirect`` does for LL/LL128: no registered user buffers here.
Each ``generic_op`` is a generator that yields whenever it would spin, recording what it waits for with the kernel.
"""
from __future__ import annotations

import numpy as np

from collectives.include.bitops import div_up, round_up
from collectives.include.connector import Connector
from collectives.include.device import NCCL_STEPS

from tracing.events import now

from collectives.misc import futex
from .reduce_copy import RedOp


class Primitives:
    proto = ""
    # What the algorithm is doing now: the primitive (for hang reports), and for the trace its loop and chunk.
    prim = ""
    loop = chunk = 0
    locate = None  # tracing: (prim, src, dst) -> (loop, chunk), set by the communicator
    t_mark = 0   # tracing: when the previous slice/step of this channel ended (the next one starts there)
    t_wait = 0   # tracing: the last moment a wait of this channel was still waiting

    def __init__(self, kernel, channel: int, recv, send, sendbuff: np.ndarray, recvbuff: np.ndarray, op: RedOp,
                 group: int = 0, chunk_steps: int = 1):
        """``chunk_steps``: each connection's step starts rounded up to a multiple of it (Simple's ``roundUp``)."""
        self.kernel, self.channel, self.group = kernel, channel, group
        self.recv_conns: list[Connector] = _peers(recv)
        self.send_conns: list[Connector] = _peers(send)
        self.recv_conn = self.recv_conns[0] if self.recv_conns else None  # peer 0 (the only one on a ring)
        self.send_conn = self.send_conns[0] if self.send_conns else None
        self.input, self.output, self.op = sendbuff, recvbuff, op
        self.esize = sendbuff.dtype.itemsize
        self._checked_prev = False
        self.tracer = kernel.tracer  # None unless NCCLLAB_TRACE
        # (connector, its step minus peer 0's step) per peer: the hot loops walk these
        self.recv_pairs, self.recv_step = _steps(self.recv_conns, chunk_steps)
        self.send_pairs, self.send_step = _steps(self.send_conns, chunk_steps)

    # --- the names NCCL's algorithms use (one generic_op each; the traced path only when tracing) ---
    def send_from_output(self, out: int, nelem: int):
        """``directSendFromOutput``: send what the output already holds (the tree root's broadcast)."""
        return self._op("send_from_output", out, None, nelem, False, True, from_output=True)

    def send(self, inp: int, nelem: int):
        return self._op("send", inp, None, nelem, False, True)

    def copy_send(self, inp: int, out: int, nelem: int):
        return self._op("copy_send", inp, out, nelem, False, True)

    def recv(self, out: int, nelem: int):
        return self._op("recv", None, out, nelem, True, False)

    def recv_reduce_send(self, inp: int, nelem: int):
        return self._op("recv_reduce_send", inp, None, nelem, True, True)

    def recv_reduce_copy(self, inp: int, out: int, nelem: int, post_op: bool = False):
        return self._op("recv_reduce_copy", inp, out, nelem, True, False, post_op)

    def recv_reduce_copy_send(self, inp: int, out: int, nelem: int, post_op: bool = False):
        return self._op("recv_reduce_copy_send", inp, out, nelem, True, True, post_op)

    def recv_copy_send(self, out: int, nelem: int):
        return self._op("recv_copy_send", None, out, nelem, True, True)

    def _op(self, prim: str, src_ix, dst_ix, nelem: int, recv: bool, send: bool, post_op: bool = False,
            from_output: bool = False):
        """Every named primitive is one ``generic_op``; the traced path only when tracing."""
        self.prim = prim
        if self.tracer is None:
            return self.generic_op(src_ix, dst_ix, nelem, recv, send, post_op, from_output)
        return self._traced(src_ix, dst_ix, nelem, recv, send, post_op, from_output)

    def _traced(self, src_ix, dst_ix, nelem, recv, send, post_op, from_output=False):
        t0 = self.t_mark = now()
        if self.locate is not None:
            self.loop, self.chunk = self.locate(self.prim, src_ix, dst_ix)
        yield from self.generic_op(src_ix, dst_ix, nelem, recv, send, post_op, from_output)
        offset = src_ix if src_ix is not None else dst_ix
        self.tracer.add("prim", self.kernel.op_count, self.channel, self.prim, self.peer(recv, send)[0],
                        self.peer(recv, send)[1], self.loop, self.chunk, offset, max(nelem, 0), t0, now())

    def peer(self, recv: bool, send: bool) -> tuple[int, int]:
        return (self.recv_conn.peer if recv else -1, self.send_conn.peer if send else -1)

    def trace_step(self, recv, send, slice_ix, step, offset, nelem, nbytes, t0) -> None:
        """One slice (Simple) or step (LL/LL128) that began at ``t0``; ``t_mark`` is when its waits ended.  With
        several peers (a tree) one record per peer index: the i-th recv peer and the i-th send peer (or -1), so
        that every movement of the slice to every peer is in the trace."""
        t1 = now()
        t_ready = self.t_wait if self.t_wait > t0 else t0
        rps = [c.peer for c in self.recv_conns] if recv else []
        sps = [c.peer for c in self.send_conns] if send else []
        for i in range(max(len(rps), len(sps), 1)):
            rp = rps[i] if i < len(rps) else -1
            sp = sps[i] if i < len(sps) else -1
            self.tracer.add("step", self.kernel.op_count, self.channel, self.prim, rp, sp, self.loop, self.chunk,
                            slice_ix, step % NCCL_STEPS, step, offset, nelem, nbytes, t0, t_ready, t1)
        self.t_mark = t1

    def generic_op(self, src_ix, dst_ix, nelem: int, recv: bool, send: bool, post_op: bool,
                   from_output: bool = False):
        """``from_output``: the source is the output buffer, with no pre-op (``directSendFromOutput``)."""
        raise NotImplementedError

    def source(self, src_ix: int, n: int, from_output: bool) -> np.ndarray:
        return (self.output if from_output else self.input)[src_ix:src_ix + n]

    # --- shared pieces ---
    def finished(self, gen):
        """Run a thread group's work, then this destructor (the step counters are saved for the next call)."""
        yield from gen
        self.finish()

    def finish(self) -> None:
        """Destructor: save every connection's step counter for the next collective."""
        for conn, delta in self.recv_pairs:
            conn.step = self.recv_step + delta
        for conn, delta in self.send_pairs:
            conn.step = self.send_step + delta

    def wait_send_credit(self, steps: int):
        """``waitSend``, per send peer: at most NCCL_STEPS steps in flight, ``head + NCCL_STEPS >= step + steps``."""
        for sconn, delta in self.send_pairs:
            target = self.send_step + delta + steps
            while int(sconn.head[0]) + NCCL_STEPS < target:
                self.kernel.waiting(self, "head", sconn.peer, self.send_step + delta, sconn.head, sconn.head_sleep)
                yield

    def first_recv_done(self) -> None:
        """Before using the peers' first data of this collective, check they run the same collective."""
        if not self._checked_prev:
            for conn in self.recv_conns:
                self.kernel.check_peer_op(conn.peer)
            self._checked_prev = True

    def post_heads(self) -> None:
        """postRecv on every recv peer: free the slots up to its step; wake the sender if it sleeps on head."""
        for conn, delta in self.recv_pairs:
            conn.head[0] = self.recv_step + delta
            if conn.head_sleep[0]:
                futex.wake(conn.head_addr)

    def post_tails(self) -> None:
        """postSend (Simple) on every send peer: publish its step after the data (x86 keeps stores in order)."""
        for conn, delta in self.send_pairs:
            conn.tail[0] = self.send_step + delta
            if conn.tail_sleep[0]:
                futex.wake(conn.tail_addr)

    @staticmethod
    def ring_doorbell(conn: Connector) -> None:
        """LL/LL128 have no tail; if the reader sleeps, bump its doorbell and wake it (ours, see futex.py)."""
        if conn.tail_sleep[0]:
            conn.doorbell[0] += 1
            futex.wake(conn.bell_addr)


def _steps(conns: list, chunk_steps: int) -> tuple[list, int]:
    """Each connection's starting step, rounded up to ``chunk_steps``, as (pairs, peer 0's step)."""
    if len(conns) == 1:  # a ring: the common case, kept cheap (it runs once per channel per collective)
        return [(conns[0], 0)], round_up(conns[0].step, chunk_steps)
    steps = [div_up(c.step, chunk_steps) * chunk_steps for c in conns]
    first = steps[0] if steps else 0
    return [(c, s - first) for c, s in zip(conns, steps)], first


def _peers(conns) -> list:
    """``None``, one connector, or NCCL's ``down[]``-style list (entries of -1 / None are absent peers)."""
    if conns.__class__ is Connector:
        return [conns]
    if conns is None:
        return []
    return [c for c in conns if c is not None]
