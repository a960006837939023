"""A primitives object's state on the GPU (NCCL ``src/device/primitives.h``: ``class Primitives``'s constructor and
destructor, ``loadRecvConn`` / ``loadSendConn``).

numba kernels have no classes, so each thread keeps the object in a small local int64 array ``P``: its recv and
send connections (up to 3 each, NCCL's ``Fan``), each connection's step, and where the thread sits in its group.
Every thread of a group advances its own copy of the steps identically, so nothing of ``P`` is shared; thread 0
of the group alone writes to memory others read (head at construction, the steps at the end), with
``sync.publish`` (``fence.acq_rel.sys``, then a relaxed store).
Connection memory: ``ctrl[c] = [head, tail]`` and ``steps[c] = [sender's step, receiver's step]`` for connection
``c``; ``conns[c] = [sender rank, receiver rank]`` names the peer in a deadline message.
"""
from __future__ import annotations

import numpy as np

from collectives.include import bitops
from collectives.include.device import NCCL_STEPS

from .numba_cuda import cuda
from .sync import WHAT_HEAD, group_sync, publish, wait_ge

P_WORDS = 24
NRECV, RECV, NSEND, SEND, RSTEP, SSTEP = 0, 1, 4, 5, 8, 11
GROUP, GTID, GTHREADS, CHANNEL, RANK, RL, SPC, SPS, BTID = 14, 15, 16, 17, 18, 19, 20, 21, 22
HEAD, TAIL = 0, 1


div_up = cuda.jit(device=True)(bitops.div_up)  # NCCL's DIVUP, the host's own, compiled for the device


@cuda.jit(device=True)
def imin(a, b):  # the builtin min/max overloads do not compile for CUDA in numba 0.68
    return a if a < b else b


@cuda.jit(device=True)
def imax(a, b):
    return a if a > b else b


@cuda.jit(device=True)
def prims_init(P, r0, r1, r2, s0, s1, s2, steps, ctrl, spc, sps, group, gtid, gthreads, channel, rank, rl,
               post_skipped, btid):
    """Load the connections (-1: absent peer), round each step up to ``spc * sps`` (Simple's ``roundUp``) and,
    for Simple, return the skipped credit to the senders at once (head = the rounded step).  ``btid``: the
    thread's index in its block (LL128 numbers its warps by it)."""
    chunk = spc * sps
    nr = 0
    for c in (r0, r1, r2):
        if c >= 0:
            P[RECV + nr] = c
            P[RSTEP + nr] = div_up(steps[c, 1], chunk) * chunk
            nr += 1
    ns = 0
    for c in (s0, s1, s2):
        if c >= 0:
            P[SEND + ns] = c
            P[SSTEP + ns] = div_up(steps[c, 0], chunk) * chunk
            ns += 1
    P[NRECV] = nr
    P[NSEND] = ns
    P[GROUP] = group
    P[GTID] = gtid
    P[GTHREADS] = gthreads
    P[CHANNEL] = channel
    P[RANK] = rank
    P[RL] = rl
    P[SPC] = spc
    P[SPS] = sps
    P[BTID] = btid
    if post_skipped and gtid == 0:
        for i in range(nr):
            publish(ctrl, (P[RECV + i], HEAD), np.int64(P[RSTEP + i]))


@cuda.jit(device=True)
def prims_finish(P, steps):
    """The destructor: save each connection's step for the next collective."""
    if P[GTID] == 0:
        for i in range(P[NRECV]):
            steps[P[RECV + i], 1] = P[RSTEP + i]
        for i in range(P[NSEND]):
            steps[P[SEND + i], 0] = P[SSTEP + i]
        cuda.threadfence_system()


@cuda.jit(device=True)
def op_begin(P, nelem, recv, send):
    """The first lines of every protocol's ``GenericOp``: (nrecv, nsend, nelem), the recv and send peers the op
    moves data with (``fan.nrecv()`` / ``fan.nsend()``, none in a direction it does not move: NCCL's ``RECV`` /
    ``SEND``) and its element count, never below 0."""
    if nelem < 0:
        nelem = 0
    return (P[NRECV] if recv else 0), (P[NSEND] if send else 0), nelem


def make_load_src(premul):
    """``load_src(inp, out, rl, ix, from_output, scal)``: a primitive's user source element ``ix`` of local rank
    ``rl``: the output for ``sendFromOutput`` / ``recvCopySend`` (``from_output``), else the input with
    ``applyPreOp`` (``premul``: Avg's pre-multiplication by ``scal[0]``; the identity for the other ops)."""
    @cuda.jit(device=True)
    def load_src(inp, out, rl, ix, from_output, scal):
        if from_output:
            return out[rl, ix]
        return premul(inp[rl, ix], scal[0])
    return load_src


@cuda.jit(device=True)
def wait_send(P, ctrl, conns, bars, abort, timeout_ns, nsend, gtid, gth, rl, ch, grp):
    """``waitSend`` of LL and LL128 (``prims_ll.h``, ``prims_ll128.h``): one step of credit from each of the first
    ``nsend`` send peers (``head + NCCL_STEPS > step``), thread ``i`` of the group polling send peer ``i``; then
    the group's barrier (LL's ``waitSend`` ends with it, LL128's ``GenericOp`` calls it next).  False on every
    thread of the group when a wait failed or the launch aborted.  ``gtid, gth, rl, ch, grp``: ``P[GTID]``,
    ``P[GTHREADS]``, ``P[RL]``, ``P[CHANNEL]``, ``P[GROUP]`` as the op holds them (read from ``P`` again, after
    its stores at computed indices, they cost the kernels more spills)."""
    ok = True
    i = gtid
    while i < nsend:
        c = P[SEND + i]
        if ok:
            ok = wait_ge(ctrl, (c, HEAD), P[SSTEP + i] + 1 - NCCL_STEPS, abort, timeout_ns, P[RANK], ch,
                         P[SSTEP + i], conns[c, 1], WHAT_HEAD, grp)
        i += gth
    return not group_sync(bars, rl, ch, grp, gth, not ok, abort)


@cuda.jit(device=True)
def post_recv(P, ctrl, bars, abort, nrecv, failed, gtid, gth, rl, ch, grp):
    """``postRecv`` of LL and LL128 (``prims_ll.h``; LL128's ``GenericOp`` has the barrier just before it): the
    group's barrier (``failed``: this thread's vote that the step failed), then each of the first ``nrecv`` recv
    peers' steps advances and thread 0 returns the credit (head = the new step).  False when the launch
    aborted.  ``gtid, gth, rl, ch, grp``: as for ``wait_send``."""
    if group_sync(bars, rl, ch, grp, gth, failed, abort):
        return False
    for j in range(nrecv):
        P[RSTEP + j] += 1
        if gtid == 0:
            publish(ctrl, (P[RECV + j], HEAD), np.int64(P[RSTEP + j]))
    return True
