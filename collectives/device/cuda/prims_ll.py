"""The LL protocol on the GPU (NCCL ``src/device/prims_ll.h``: ``LLGenericOp``, ``readLL``, ``storeLL``, ``waitSend``,
``postRecv``, ``incSend``), the same step and flag logic as ``collectives/device/prims_ll.py``.

A 16-byte line is ``{data1, flag1, data2, flag2}``; here two 64-bit words ``data | flag << 32``, each written with
one volatile 8-byte store and polled with one volatile 8-byte load (``sync.store`` / ``sync.load``), so a half-line
never tears.  Deliberate difference: NCCL moves the line with one 16-byte volatile access; a reader checks both
flags either way, so the guarantee is the same.  Each thread of the
group owns lines ``gtid, gtid + nthreads, ...``: it polls its lines from every recv peer until both flags equal
``NCCL_LL_FLAG(step + 1)``, reduces their elements with the user's, and writes its lines to every send peer.
The unpacked words go through a per-thread-line staging area (NCCL keeps them in registers): a line's data is
8 bytes of any element type, and numba cannot reinterpret registers.
No tail: the sender only waits for credit (``head + NCCL_STEPS > step``); the receiver returns it after a
barrier (``postRecv``).  On a clean-mask step the sender fills the rest of the slot with ``{0, flag}``.
"""
from __future__ import annotations

import numpy as np
from .numba_cuda import cuda

from collectives.include.device import NCCL_STEPS
from collectives.include.device import LL_CLEAN_MASK, LL_FLAG_MOD

from .prims import CHANNEL, GROUP, GTHREADS, GTID, RANK, RECV, RL, RSTEP, SEND, SSTEP, imin, \
    make_load_src, op_begin, post_recv, wait_send
from .sync import WHAT_LL_FLAG, check_abort, load, set_abort, store
from .clock import now_ns, pause

LOW = np.uint64(0xFFFFFFFF)
SHIFT = np.uint64(32)
SEND_SLOT = 3  # staging slot of the packed send data; 0..2 are the recv peers'


@cuda.jit(device=True)
def ll_flag(step):
    return np.uint64((step + 1) % LL_FLAG_MOD)


@cuda.jit(device=True)
def read_line(fifo, c, slot, w, flag, abort, timeout_ns, rank, channel, step, peer, group):
    """``readLL``: both halves of line ``w // 2`` carry ``flag``; returns (ok, data1, data2).  Every thread polls
    its own lines (NCCL's LL has no poller: the data is in the flag word), checking the abort word and its deadline
    every ``SPINS`` spins."""
    a = load(fifo, (c, slot, w))
    b = load(fifo, (c, slot, w + 1))
    if (a >> SHIFT) == flag and (b >> SHIFT) == flag:
        return True, a & LOW, b & LOW
    t0 = now_ns()
    spins = 0
    verdict = 0
    while (a >> SHIFT) != flag or (b >> SHIFT) != flag:
        spins, verdict = check_abort(spins, abort, t0, timeout_ns)
        if verdict != 0:
            break
        pause()
        a = load(fifo, (c, slot, w))
        b = load(fifo, (c, slot, w + 1))
    if verdict == 2:
        set_abort(abort, rank, channel, step, peer, WHAT_LL_FLAG, group)
    return verdict == 0, a & LOW, b & LOW


def make_ll_op(fn, premul, postdiv):
    load_src = make_load_src(premul)

    @cuda.jit(device=True)
    def ll_op(P, inp, out, fifo, stage_t, stage_u, ctrl, conns, bars, abort, scal, nranks, timeout_ns,
              src_ix, dst_ix, nelem, recv, send, post_op, from_output):
        """``LLGenericOp``: one step per call, even for nelem = 0 (``waitSend``; each thread's lines: ``readLL``
        from every recv peer, reduce, ``storeLL`` to every send peer; ``incSend``'s cleanup; ``postRecv``); False
        on abort."""
        gtid, gth, rl, ch, grp = P[GTID], P[GTHREADS], P[RL], P[CHANNEL], P[GROUP]
        nrecv, nsend, nelem = op_begin(P, nelem, recv, send)
        esize = out.itemsize
        per_line = 8 // esize
        nlines = (nelem * esize + 7) // 8
        slot_lines = fifo.shape[2] // 2
        has_src, has_dst = src_ix >= 0, dst_ix >= 0
        if not wait_send(P, ctrl, conns, bars, abort, timeout_ns, nsend, gtid, gth, rl, ch, grp):
            return False
        failed = False
        line = gtid
        while line < nlines and not failed:
            w = 2 * line
            for j in range(nrecv):
                c, step = P[RECV + j], P[RSTEP + j]
                good, d1, d2 = read_line(fifo, c, step % NCCL_STEPS, w, ll_flag(step), abort, timeout_ns,
                                         P[RANK], ch, step, conns[c, 0], grp)
                if not good:  # the launch aborted: on to the group's last barrier, which every thread must reach
                    failed = True
                    break
                stage_u[rl, ch, grp, j, w] = np.uint32(d1)
                stage_u[rl, ch, grp, j, w + 1] = np.uint32(d2)
            if failed:
                break
            if nsend:  # zero the padding of a partial last line
                stage_u[rl, ch, grp, SEND_SLOT, w] = 0
                stage_u[rl, ch, grp, SEND_SLOT, w + 1] = 0
            e = line * per_line
            e_end = imin(e + per_line, nelem)
            while e < e_end:
                k = 0
                if has_src:
                    v = load_src(inp, out, rl, src_ix + e, from_output, scal)
                else:
                    v = stage_t[rl, ch, grp, 0, e]
                    k = 1
                for j in range(k, nrecv):
                    v = fn(v, stage_t[rl, ch, grp, j, e])
                if post_op:
                    v = postdiv(v, nranks)
                if has_dst:
                    out[rl, dst_ix + e] = v
                if nsend:
                    stage_t[rl, ch, grp, SEND_SLOT, e] = v
                e += 1
            for j in range(nsend):  # storeLL: data and flag in each 8-byte half, one volatile store each
                c, step = P[SEND + j], P[SSTEP + j]
                flag = ll_flag(step) << SHIFT
                store(fifo, (c, step % NCCL_STEPS, w), flag | np.uint64(stage_u[rl, ch, grp, SEND_SLOT, w]))
                store(fifo, (c, step % NCCL_STEPS, w + 1),
                      flag | np.uint64(stage_u[rl, ch, grp, SEND_SLOT, w + 1]))
            line += gth
        for j in range(nsend):  # incSend's cleanup on clean-mask steps
            c, step = P[SEND + j], P[SSTEP + j]
            if (step & LL_CLEAN_MASK) == LL_CLEAN_MASK and not failed:
                flag = ll_flag(step) << SHIFT
                line = nlines + gtid
                while line < slot_lines:
                    store(fifo, (c, step % NCCL_STEPS, 2 * line), flag)
                    store(fifo, (c, step % NCCL_STEPS, 2 * line + 1), flag)
                    line += gth
            P[SSTEP + j] += 1
        return post_recv(P, ctrl, bars, abort, nrecv, failed, gtid, gth, rl, ch, grp)
    return ll_op
