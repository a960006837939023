"""The Simple protocol on the GPU (NCCL ``src/device/prims_simple.h``: ``genericOp``, ``waitPeer``, ``postPeer``),
the same step and slice logic as ``collectives/device/prims_simple.py``.

Per slice: the group's first threads wait, one per peer as NCCL's roles (thread ``i`` for recv peer ``i``, then
thread ``nrecv + j`` for send peer ``j``), for ``tail >= step + StepPerSlice`` of each recv peer and for send credit
``head + NCCL_STEPS >= step + StepPerSlice`` of each send peer, with a volatile load (``sync.wait_ge``); the rest
of the group waits at its named barrier; every thread then reduces and copies a strided share of the slice's
elements; barrier; thread 0 publishes (``fence.acq_rel.sys``, then a relaxed store) the new step into the senders'
head and the receivers' tail.  Empty trailing slices still wait and post.
"""
from __future__ import annotations

import numpy as np
from .numba_cuda import cuda

from collectives.include.device import NCCL_STEPS

from .prims import (CHANNEL, GROUP, GTHREADS, GTID, HEAD, RANK, RECV, RL, RSTEP, SEND, SPC, SPS,
                    SSTEP, TAIL, div_up, imax, imin, make_load_src, op_begin)
from .sync import WHAT_HEAD, WHAT_TAIL, group_sync, publish, wait_ge


def make_simple_op(fn, premul, postdiv):
    load_src = make_load_src(premul)

    @cuda.jit(device=True)
    def simple_op(P, inp, out, fifo, stage_a, stage_b, ctrl, conns, bars, abort, scal, nranks, timeout_ns,
                  src_ix, dst_ix, nelem, recv, send, post_op, from_output):
        """``genericOp``: ``src_ix``/``dst_ix`` < 0 mean no user source / destination; False on abort.
        ``stage_a``, ``stage_b``: unused (Simple stages nothing); the three protocols' ops take the same
        arguments, so that the kernel calls each the same way."""
        spc, sps = P[SPC], P[SPS]
        gtid, gth, rl = P[GTID], P[GTHREADS], P[RL]
        nrecv, nsend, nelem = op_begin(P, nelem, recv, send)
        step_elems = fifo.shape[1] // NCCL_STEPS
        slice_size = imax(div_up(nelem, 16 * spc) * 16, step_elems * sps // 32)
        has_src, has_dst = src_ix >= 0, dst_ix >= 0
        offset = 0
        for _ in range(spc):
            real = imax(0, imin(slice_size, nelem - offset))
            ok = True
            k = gtid
            while k < nrecv + nsend:  # waitPeer: thread k polls peer k, recv peers first (NCCL's roles)
                if ok and k < nrecv:  # the recv peer has filled this slice
                    c = P[RECV + k]
                    ok = wait_ge(ctrl, (c, TAIL), P[RSTEP + k] + sps, abort, timeout_ns, P[RANK], P[CHANNEL],
                                 P[RSTEP + k], conns[c, 0], WHAT_TAIL, P[GROUP])
                elif ok:  # ... and the send peer has room for it
                    j = k - nrecv
                    c = P[SEND + j]
                    ok = wait_ge(ctrl, (c, HEAD), P[SSTEP + j] + sps - NCCL_STEPS, abort, timeout_ns, P[RANK],
                                 P[CHANNEL], P[SSTEP + j], conns[c, 1], WHAT_HEAD, P[GROUP])
                k += gth
            if group_sync(bars, rl, P[CHANNEL], P[GROUP], gth, not ok, abort):  # subBarrier
                return False
            e = gtid
            while e < real:
                k = 0
                if has_src:
                    v = load_src(inp, out, rl, src_ix + offset + e, from_output, scal)
                else:
                    v = fifo[P[RECV], (P[RSTEP] % NCCL_STEPS) * step_elems + e]
                    k = 1
                for j in range(k, nrecv):
                    v = fn(v, fifo[P[RECV + j], (P[RSTEP + j] % NCCL_STEPS) * step_elems + e])
                if post_op:
                    v = postdiv(v, nranks)
                if has_dst:
                    out[rl, dst_ix + offset + e] = v
                for j in range(nsend):
                    fifo[P[SEND + j], (P[SSTEP + j] % NCCL_STEPS) * step_elems + e] = v
                e += gth
            if group_sync(bars, rl, P[CHANNEL], P[GROUP], gth, False, abort):  # barrier
                return False
            for j in range(nrecv):  # postPeer
                P[RSTEP + j] += sps
                if gtid == 0:
                    publish(ctrl, (P[RECV + j], HEAD), np.int64(P[RSTEP + j]))
            for j in range(nsend):
                P[SSTEP + j] += sps
                if gtid == 0:
                    publish(ctrl, (P[SEND + j], TAIL), np.int64(P[SSTEP + j]))
            offset += slice_size
        return True
    return simple_op
