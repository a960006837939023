"""The LL protocol's compiled kernel (NCCL ``src/device/prims_ll.h``: ``LLGenericOp`` with ``readLL``/``storeLL``,
``waitSend``, ``postRecv`` and ``incSend``'s cleanup), run by ``compiled.py`` over the primitive calls it recorded
from our ``run_ring``.

For each recorded call ``run_ops`` does what ``PrimitivesLL.generic_op`` does: ``waitSend`` on head, ``readLL`` of
every line of the recv slot until both flags of each line are the step's, the reduction ``fn(local, peer)``, the
store to the output, ``storeLL`` of every line with the step's flag (and ``incSend``'s cleanup on clean-mask steps,
and ``connFifo`` for a proxied connection), then ``postRecv`` on head.  Same memory, flags, step counters and
summation order as the readable path, so results are bitwise its results (``tests/test_ll_compiled.py``).
"""
from __future__ import annotations

import numba
import numpy as np

from collectives.include.device import NCCL_STEPS

from .compiled_common import (BLOCKED, CANON, CHECKED, CLEAN_MASK, CREDIT, DONE, DST, END, FIFO, FIRST, FLAG_MOD,
                              FROM_OUT, IS_FLOAT, LINES, MISMATCH, NCH, NELEM, OPCODE, PC, PDESC, PROG, R_HEADSLEEP,
                              REC, RHEAD, RSTAGE, RSTEP, RSTEP_W, RWORDS, S_DOORBELL, S_TAILSLEEP, SHEAD, SND, SRC,
                              SSTAGE, SSTEP, SSTEP_W, STEP_BYTES, SWORDS, WAIT, WAIT_FLAG, WAIT_HEAD, WAIT_MISMATCH,
                              WSTEP, blocked, done, fence, fn, i64, moved, new_wait, peer_runs_same_call, ptr,
                              publish, row, u32, u64, wake)


@numba.njit(nogil=True, cache=True)
def run_ops(ctl, inp, out, start_sig):
    """Execute every channel's recorded calls, round-robin, until all are done (DONE), none has moved for
    ``MAX_IDLE`` rounds (BLOCKED: each channel's row says what it waits for), or a peer runs another call
    (MISMATCH).  ``start_sig`` (empty when resuming): the call's signature; publish it and load the step counters
    first."""
    step_bytes, flag_mod, clean_mask = ctl[STEP_BYTES], ctl[FLAG_MOD], ctl[CLEAN_MASK]
    opcode, is_float, nch = ctl[OPCODE], ctl[IS_FLOAT], ctl[NCH]
    words_per_slot, lines_per_slot = step_bytes // 8, step_bytes // 16
    esize = out.itemsize
    nwords = words_per_slot // 2
    low, sh = np.uint64(0xFFFFFFFF), np.uint64(32)
    canon = numba.carray(ptr(ctl[CANON:].ctypes.data), 1, out.dtype)[0]
    prog = numba.carray(ptr(ctl[PROG]), (row(ctl, nch - 1)[END], 7), np.int64)
    if len(start_sig) > 0:
        publish(ctl, start_sig)  # this rank's call, before any data moves
        for c in range(nch):
            st = row(ctl, c)
            st[PC], st[LINES], st[WAIT], st[CREDIT], st[CHECKED] = st[FIRST], 0, 0, 0, st[PDESC] == 0
            st[RSTEP] = i64(st[RSTEP_W])[0]
            st[SSTEP] = i64(st[SSTEP_W])[0]
    fence()  # a sleeper's mark, stored before this call, is visible before we look at the flags again
    w = new_wait()
    while True:
        remaining, progressed = 0, False
        for c in range(nch):
            st = row(ctl, c)
            if st[PC] >= st[END]:
                continue
            rwords = numba.carray(ptr(st[RWORDS]), NCCL_STEPS * words_per_slot, np.uint64)
            swords = numba.carray(ptr(st[SWORDS]), NCCL_STEPS * words_per_slot, np.uint64)
            shead = u64(st[SHEAD])
            rst = numba.carray(ptr(st[RSTAGE]), nwords, np.uint64)
            sst = numba.carray(ptr(st[SSTAGE]), nwords, np.uint64)
            rt = numba.carray(ptr(st[RSTAGE]), nwords * 8 // esize, out.dtype)
            stt = numba.carray(ptr(st[SSTAGE]), nwords * 8 // esize, out.dtype)
            while st[PC] < st[END]:
                op = prog[st[PC]]
                recv, send, src, dst, nelem, from_out = op[REC], op[SND], op[SRC], op[DST], op[NELEM], op[FROM_OUT]
                nbytes = nelem * esize
                nlines = (nbytes + 7) // 8
                if send and st[CREDIT] == 0:  # waitSend: at most NCCL_STEPS steps ahead of the reader
                    if shead[0] + np.uint64(NCCL_STEPS) < np.uint64(st[SSTEP] + 1):
                        st[WAIT], st[WSTEP] = WAIT_HEAD, st[SSTEP]
                        break
                    st[CREDIT] = 1
                if recv:  # readLL: every line carries the step's flag in both halves
                    step = st[RSTEP]
                    flag = np.uint64((step + 1) % flag_mod)
                    base = (step % NCCL_STEPS) * words_per_slot
                    i = st[LINES]
                    while i < nlines:
                        w0 = rwords[base + 2 * i]
                        w1 = rwords[base + 2 * i + 1]
                        if (w0 >> sh) != flag or (w1 >> sh) != flag:
                            break
                        rst[i] = (w0 & low) | (w1 << sh)
                        i += 1
                    st[LINES] = i
                    if i < nlines:
                        st[WAIT], st[WSTEP] = WAIT_FLAG, step
                        break
                    if nbytes > 0 and st[CHECKED] == 0:  # the peer's first data: is it running the same call?
                        if not peer_runs_same_call(ctl, st):
                            st[WAIT] = WAIT_MISMATCH
                            return MISMATCH
                        st[CHECKED] = 1
                # reduceCopy: acc = fn(local, peer) element by element, to the output and the send staging
                if send and nbytes % 8:
                    sst[nbytes // 8] = 0  # the padding of the last 8-byte unit goes out as zeros
                for e in range(nelem):
                    if src >= 0:
                        a = out[src + e] if from_out else inp[src + e]
                        v = fn(a, rt[e], opcode, is_float, canon) if recv else a
                    else:
                        v = rt[e]
                    if dst >= 0:
                        out[dst + e] = v
                    if send:
                        stt[e] = v
                if send:  # storeLL, incSend's cleanup, then the reader's doorbell if it sleeps
                    step = st[SSTEP]
                    flag = np.uint64((step + 1) % flag_mod) << sh
                    base = (step % NCCL_STEPS) * words_per_slot
                    clean = (step & clean_mask) == clean_mask
                    if st[FIFO]:
                        numba.carray(ptr(st[FIFO]), NCCL_STEPS, np.int64)[step % NCCL_STEPS] = \
                            step_bytes if clean else nlines * 16
                    for i in range(nlines):
                        v64 = sst[i]
                        swords[base + 2 * i] = (v64 & low) | flag
                        swords[base + 2 * i + 1] = (v64 >> sh) | flag
                    if clean:
                        for i in range(nlines, lines_per_slot):
                            swords[base + 2 * i] = flag
                            swords[base + 2 * i + 1] = flag
                    fence()  # the flags are visible before we read whether the reader sleeps
                    if u32(st[S_TAILSLEEP])[0]:
                        u32(st[S_DOORBELL])[0] += np.uint32(1)
                        wake(st[S_DOORBELL])
                    st[SSTEP] += 1
                if recv:  # postRecv: free the slot, wake the sender if it sleeps on head
                    st[RSTEP] += 1
                    u64(st[RHEAD])[0] = np.uint64(st[RSTEP])
                    fence()
                    if u32(st[R_HEADSLEEP])[0]:
                        wake(st[RHEAD])
                st[PC] += 1
                st[LINES] = 0
                st[CREDIT] = 0
                progressed = True
            if st[PC] < st[END]:
                remaining += 1
            else:  # the primitives' destructor: save the step counters for the next collective
                i64(st[RSTEP_W])[0] = st[RSTEP]
                i64(st[SSTEP_W])[0] = st[SSTEP]
        if remaining == 0:
            done(ctl, w)
            return DONE
        if progressed:
            moved(ctl, w)
        elif blocked(ctl, nch, w):
            return BLOCKED
